#include "gpu_group.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstring>
#include <mutex>

#include "../device_api.h"

namespace bps {
namespace {

// NCCL's ABI, as nccl.h declares it (stable since NCCL 2.0).
struct NcclUniqueId {
  char internal[BPS_GROUP_ID_BYTES];
};
using NcclComm = void*;
using NcclResult = int;  // 0: success
constexpr NcclResult kNcclInProgress = 7;

struct Nccl {
  NcclResult (*get_unique_id)(NcclUniqueId*);
  NcclResult (*comm_init_rank)(NcclComm*, int, NcclUniqueId, int);
  NcclResult (*comm_destroy)(NcclComm);
  NcclResult (*comm_abort)(NcclComm);
  NcclResult (*comm_get_async_error)(NcclComm, NcclResult*);
  NcclResult (*reduce)(const void*, void*, size_t, int, int, int, NcclComm, cudaStream_t);
  NcclResult (*broadcast)(const void*, void*, size_t, int, int, NcclComm, cudaStream_t);
  NcclResult (*group_start)();
  NcclResult (*group_end)();
  const char* (*error_string)(NcclResult);
};

const Nccl* Load(std::string* why) {
  static Nccl nccl;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      failure = std::string("NCCL cannot be loaded (pip install tf_bps[gpu] brings it): ") +
                dlerror();
      return;
    }
    auto bind = [&](auto* slot, const char* symbol) {
      *reinterpret_cast<void**>(slot) = dlsym(library, symbol);
      if (!*reinterpret_cast<void**>(slot) && failure.empty())
        failure = std::string("libnccl.so.2 lacks ") + symbol;
    };
    bind(&nccl.get_unique_id, "ncclGetUniqueId");
    bind(&nccl.comm_init_rank, "ncclCommInitRank");
    bind(&nccl.comm_destroy, "ncclCommDestroy");
    bind(&nccl.comm_abort, "ncclCommAbort");
    bind(&nccl.comm_get_async_error, "ncclCommGetAsyncError");
    bind(&nccl.reduce, "ncclReduce");
    bind(&nccl.broadcast, "ncclBroadcast");
    bind(&nccl.group_start, "ncclGroupStart");
    bind(&nccl.group_end, "ncclGroupEnd");
    bind(&nccl.error_string, "ncclGetErrorString");
  });
  if (!failure.empty()) {
    *why = failure;
    return nullptr;
  }
  return &nccl;
}

// Where NCCL is needed it has been loaded: every group starts with NcclDeviceKey.
const Nccl& Loaded() {
  std::string ignored;
  return *Load(&ignored);
}

int Failed(NcclResult result, const char* what) {
  if (result == 0) return 0;
  DeviceError() = std::string(what) + ": " + Loaded().error_string(result);
  return -1;
}

int CudaFailed(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return 0;
  DeviceError() = std::string(what) + ": " + cudaGetErrorString(error);
  return -1;
}

// The core's DataType as NCCL's; -1: NCCL has no such type.
int NcclType(int dtype) {
  switch (dtype) {
    case 1: return 6;  // float16
    case 2: return 9;  // bfloat16
    case 3: return 7;  // float32
    case 4: return 8;  // float64
    case 5: return 2;  // int32
    case 6: return 4;  // int64
    case 7: return 1;  // uint8
    case 8: return 0;  // int8
    default: return -1;
  }
}

// The core's ReduceOp as NCCL's: an average is a sum here (the engine divides).
int NcclOp(int reduce_op) {
  switch (reduce_op) {
    case 0: case 1: return 0;  // sum
    case 4: return 1;          // product
    case 3: return 2;          // max
    case 2: return 3;          // min
    default: return -1;
  }
}

NcclComm CommOf(void* group) { return static_cast<NcclComm>(group); }

}  // namespace

int NcclDeviceKey(int device, char* key, size_t size) {
  std::string why;
  if (!Load(&why)) {
    DeviceError() = why;
    return -1;
  }
  return CudaFailed(cudaDeviceGetPCIBusId(key, static_cast<int>(size), device),
                    "cudaDeviceGetPCIBusId");
}

int NcclGroupId(void* id) {
  NcclUniqueId made;
  if (Failed(Loaded().get_unique_id(&made), "ncclGetUniqueId")) return -1;
  std::memcpy(id, made.internal, sizeof(made.internal));
  return 0;
}

int NcclGroupOpen(int device, const void* id, int size, int member, void** group) {
  if (CudaFailed(cudaSetDevice(device), "cudaSetDevice")) return -1;
  NcclUniqueId given;
  std::memcpy(given.internal, id, sizeof(given.internal));
  NcclComm comm = nullptr;
  if (Failed(Loaded().comm_init_rank(&comm, size, given, member), "ncclCommInitRank")) return -1;
  *group = comm;
  return 0;
}

void NcclGroupClose(int device, void* group, int abort) {
  if (cudaSetDevice(device) != cudaSuccess) return;
  if (abort) {
    Loaded().comm_abort(CommOf(group));
  } else {
    Loaded().comm_destroy(CommOf(group));
  }
}

int NcclGroupCheck(int, void* group) {
  NcclResult state = 0;
  if (Failed(Loaded().comm_get_async_error(CommOf(group), &state), "ncclCommGetAsyncError"))
    return -1;
  if (state == kNcclInProgress) return 0;
  return Failed(state, "a collective of the local merge");
}

int NcclHasDtype(int dtype) { return NcclType(dtype) >= 0; }

int NcclReduce(int device, const void* src, void* dst, size_t count, int dtype, int reduce_op,
               int root, void* group, void* stream) {
  if (NcclType(dtype) < 0 || NcclOp(reduce_op) < 0) {
    DeviceError() = "NCCL has no such data type or reduction";
    return -1;
  }
  if (CudaFailed(cudaSetDevice(device), "cudaSetDevice")) return -1;
  return Failed(Loaded().reduce(src, dst, count, NcclType(dtype), NcclOp(reduce_op), root,
                                CommOf(group), static_cast<cudaStream_t>(stream)),
                "ncclReduce");
}

int NcclBroadcast(int device, void* buf, size_t count, int dtype, int root, void* group,
                  void* stream) {
  if (NcclType(dtype) < 0) {
    DeviceError() = "NCCL has no such data type";
    return -1;
  }
  if (CudaFailed(cudaSetDevice(device), "cudaSetDevice")) return -1;
  return Failed(Loaded().broadcast(buf, buf, count, NcclType(dtype), root, CommOf(group),
                                   static_cast<cudaStream_t>(stream)),
                "ncclBroadcast");
}

int NcclGroupBegin() { return Failed(Loaded().group_start(), "ncclGroupStart"); }

int NcclGroupEnd() { return Failed(Loaded().group_end(), "ncclGroupEnd"); }

}  // namespace bps
