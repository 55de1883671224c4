// NCCL's collectives for the CUDA device table (gpu_device.cu): the group functions of
// device_api.h. NCCL is loaded when first asked for (dlopen of libnccl.so.2, which
// tf_bps's Python side may have loaded already from the nvidia-nccl-cu12 wheel), so
// the library neither links nor needs it where no group is made.
#ifndef TF_BPS_WORKER_CUDA_GPU_GROUP_H_
#define TF_BPS_WORKER_CUDA_GPU_GROUP_H_

#include <stddef.h>

#include <string>

namespace bps {

// The calling thread's last failure (gpu_device.cu's).
std::string& DeviceError();

int NcclDeviceKey(int device, char* key, size_t size);
int NcclGroupId(void* id);
int NcclGroupOpen(int device, const void* id, int size, int member, void** group);
void NcclGroupClose(int device, void* group, int abort);
int NcclGroupCheck(int device, void* group);
int NcclHasDtype(int dtype);
int NcclReduce(int device, const void* src, void* dst, size_t count, int dtype, int reduce_op,
               int root, void* group, void* stream);
int NcclBroadcast(int device, void* buf, size_t count, int dtype, int root, void* group,
                  void* stream);
int NcclGroupBegin();
int NcclGroupEnd();

}  // namespace bps

#endif  // TF_BPS_WORKER_CUDA_GPU_GROUP_H_
