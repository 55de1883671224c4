// The CUDA device table the worker engine stages GPU tensors through (device_api.h):
// streams, events between them, asynchronous copies, host callbacks and pinned memory.
// Every call first makes `device` current on the calling thread: the engine's threads
// serve tensors of any device in turn.
#include <cuda_runtime.h>

#include <string>

#include "../device_api.h"
#include "gpu_api.h"
#include "gpu_group.h"

namespace bps {

std::string& DeviceError() {
  thread_local std::string error;
  return error;
}

namespace {

int Failed(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return 0;
  DeviceError() = std::string(what) + ": " + cudaGetErrorString(error);
  return -1;
}

int Use(int device) { return Failed(cudaSetDevice(device), "cudaSetDevice"); }

cudaStream_t StreamOf(void* stream) { return static_cast<cudaStream_t>(stream); }

const char* LastError() { return DeviceError().c_str(); }

int StreamCreate(int device, void** stream) {
  if (Use(device)) return -1;
  cudaStream_t created = nullptr;
  // Non-blocking: the engine's copies never wait for the legacy default stream.
  if (Failed(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking), "cudaStreamCreate"))
    return -1;
  *stream = created;
  return 0;
}

void StreamDestroy(int device, void* stream) {
  if (Use(device) == 0) cudaStreamDestroy(StreamOf(stream));
}

int StreamWait(int device, void* waiter, void* stream) {
  if (Use(device)) return -1;
  cudaEvent_t event = nullptr;
  if (Failed(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"))
    return -1;
  int result = Failed(cudaEventRecord(event, StreamOf(stream)), "cudaEventRecord");
  if (result == 0)
    result = Failed(cudaStreamWaitEvent(StreamOf(waiter), event, 0), "cudaStreamWaitEvent");
  // Destroying a recorded event is safe: CUDA frees it once it has completed.
  cudaEventDestroy(event);
  return result;
}

int Copy(int device, void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return 0;
  if (Use(device)) return -1;
  return Failed(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, StreamOf(stream)),
                "cudaMemcpyAsync");
}

int Scale(int device, void* buf, size_t count, int dtype, double factor, void* stream) {
  if (Use(device)) return -1;
  if (bps_gpu_scale(buf, count, dtype, factor, stream) == 0) return 0;
  DeviceError() = bps_gpu_last_error();
  return -1;
}

int Divide(int device, void* buf, size_t count, int dtype, int divisor, void* stream) {
  if (Use(device)) return -1;
  if (bps_gpu_divide(buf, count, dtype, divisor, stream) == 0) return 0;
  DeviceError() = bps_gpu_last_error();
  return -1;
}

int CallWhenDone(int device, void* stream, void (*fn)(void*), void* arg) {
  if (Use(device)) return -1;
  return Failed(cudaLaunchHostFunc(StreamOf(stream), fn, arg), "cudaLaunchHostFunc");
}

int HostAlloc(int device, size_t bytes, void** ptr) {
  // The device first: a thread with none current would make a context on device 0.
  if (Use(device)) return -1;
  // Portable: pinned for every device of the process, not only the current one.
  return Failed(cudaHostAlloc(ptr, bytes, cudaHostAllocPortable), "cudaHostAlloc");
}

void HostFree(int device, void* ptr) {
  if (Use(device) == 0) cudaFreeHost(ptr);
}

const bps_device_api kCuda = {
    "CUDA",         LastError,     StreamCreate,   StreamDestroy, StreamWait,    Copy,
    Scale,          Divide,        CallWhenDone,   HostAlloc,     HostFree,      NcclDeviceKey,
    NcclGroupId,    NcclGroupOpen, NcclGroupClose, NcclHasDtype,  NcclReduce,    NcclBroadcast,
    NcclGroupCheck, NcclGroupBegin, NcclGroupEnd};

}  // namespace
}  // namespace bps

const bps_device_api* bps_gpu_device_api(void) { return &bps::kCuda; }
