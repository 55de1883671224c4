/* The core's GPU arithmetic behind a C API (built only when a CUDA toolkit is found):
 * what the GPU path of push_pull needs on device memory, and what its tests reach
 * with CuPy arrays, no framework involved. Every function queues its work on
 * `stream` (a cudaStream_t; null: the default stream) and returns at once: 0, or -1
 * with bps_gpu_last_error() saying why (a bad dtype, no device, a launch failure).
 *
 * dtype and reduce_op take the core's wire values (common.h: DataType, ReduceOp). */
#ifndef TF_BPS_WORKER_CUDA_GPU_API_H_
#define TF_BPS_WORKER_CUDA_GPU_API_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Devices this process can use; -1 (with the reason) when the driver has none. */
int bps_gpu_device_count(void);
/* Why the last call of this thread failed. */
const char* bps_gpu_last_error(void);

/* dst[i] = op(dst[i], src[i]); Average combines as a sum. */
int bps_gpu_reduce(void* dst, const void* src, size_t count, int dtype, int reduce_op,
                   void* stream);
/* buf[i] /= divisor (an average); integers take the floor, as numpy does. */
int bps_gpu_divide(void* buf, size_t count, int dtype, int divisor, void* stream);
/* buf[i] *= factor (prescale, postscale); integers scale in double and truncate. */
int bps_gpu_scale(void* buf, size_t count, int dtype, double factor, void* stream);
/* fp16 compression of float32 tensors (BytePS's fp16 compressor, on the device). */
int bps_gpu_compress_fp16(const void* src_float32, void* dst_float16, size_t count, void* stream);
int bps_gpu_decompress_fp16(const void* src_float16, void* dst_float32, size_t count, void* stream);

/* The table through which the worker engine stages tensors in this process's GPUs
 * (../device_api.h; gpu_device.cu). */
struct bps_device_api;
const struct bps_device_api* bps_gpu_device_api(void);

#ifdef __cplusplus
}
#endif

#endif /* TF_BPS_WORKER_CUDA_GPU_API_H_ */
