// CUDA kernels for the GPU path: reductions, averages and scale factors on device
// memory, and fp16 compression. They follow reduce.h element for element (the host
// arithmetic), so a GPU tensor sums to exactly what a host tensor would.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../../common/common.h"
#include "gpu_api.h"

namespace bps {
namespace {

thread_local std::string last_error;

int Fail(const std::string& message) {
  last_error = message;
  return -1;
}

int Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return 0;
  return Fail(std::string(what) + ": " + cudaGetErrorString(error));
}

constexpr int kThreads = 256;

// Enough blocks to fill a large GPU; each thread strides over the rest.
int BlocksFor(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 4096 ? (blocks ? blocks : 1) : 4096);
}

// Arithmetic in float for the 16-bit floats, natively for everything else.
template <typename T>
struct Math {
  using Wide = T;
  __device__ static Wide Load(T value) { return value; }
  __device__ static T Store(Wide value) { return value; }
};
template <>
struct Math<__half> {
  using Wide = float;
  __device__ static float Load(__half value) { return __half2float(value); }
  __device__ static __half Store(float value) { return __float2half_rn(value); }
};
template <>
struct Math<__nv_bfloat16> {
  using Wide = float;
  __device__ static float Load(__nv_bfloat16 value) { return __bfloat162float(value); }
  __device__ static __nv_bfloat16 Store(float value) { return __float2bfloat16_rn(value); }
};

template <typename T, ReduceOp kOp>
__global__ void ReduceKernel(T* dst, const T* src, size_t count) {
  using M = Math<T>;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const auto a = M::Load(dst[i]);
    const auto b = M::Load(src[i]);
    if (kOp == ReduceOp::kMin) {
      dst[i] = M::Store(b < a ? b : a);
    } else if (kOp == ReduceOp::kMax) {
      dst[i] = M::Store(b > a ? b : a);
    } else if (kOp == ReduceOp::kProduct) {
      dst[i] = M::Store(a * b);
    } else {  // Sum, and Average (divided afterwards).
      dst[i] = M::Store(a + b);
    }
  }
}

// Integer division rounding toward minus infinity, as numpy; `divisor` > 0.
template <typename T>
__device__ T FloorDivide(T value, T divisor) {
  const T quotient = value / divisor;
  if constexpr (std::is_signed<T>::value) {
    if (value < 0 && quotient * divisor != value) return quotient - 1;
  }
  return quotient;
}

template <typename T>
__global__ void DivideKernel(T* buf, size_t count, int divisor) {
  using M = Math<T>;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_integral<T>::value) {
      buf[i] = FloorDivide<T>(buf[i], static_cast<T>(divisor));
    } else {
      using Wide = typename M::Wide;
      buf[i] = M::Store(M::Load(buf[i]) * (Wide(1) / Wide(divisor)));
    }
  }
}

template <typename T>
__global__ void ScaleKernel(T* buf, size_t count, double factor) {
  using M = Math<T>;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_integral<T>::value) {
      buf[i] = static_cast<T>(trunc(static_cast<double>(buf[i]) * factor));
    } else {
      using Wide = typename M::Wide;
      buf[i] = M::Store(static_cast<Wide>(static_cast<double>(M::Load(buf[i])) * factor));
    }
  }
}

__global__ void CompressKernel(const float* src, __half* dst, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2half_rn(src[i]);
}

__global__ void DecompressKernel(const __half* src, float* dst, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = __half2float(src[i]);
}

// Calls `launch.template operator()<T>()` with the element type of `dtype`.
template <typename Launch>
int ForDataType(int dtype, Launch&& launch) {
  switch (static_cast<DataType>(dtype)) {
    case DataType::kFloat16:
      return launch(__half{});
    case DataType::kBFloat16:
      return launch(__nv_bfloat16{});
    case DataType::kFloat32:
      return launch(float{});
    case DataType::kFloat64:
      return launch(double{});
    case DataType::kInt32:
      return launch(int32_t{});
    case DataType::kInt64:
      return launch(int64_t{});
    case DataType::kUint8:
      return launch(uint8_t{});
    case DataType::kInt8:
      return launch(int8_t{});
    case DataType::kUint16:
      return launch(uint16_t{});
    case DataType::kInt16:
      return launch(int16_t{});
    default:
      break;
  }
  return Fail("data type " + std::to_string(dtype) + " has no GPU arithmetic");
}

cudaStream_t StreamOf(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace
}  // namespace bps

using bps::Check;
using bps::Fail;
using bps::ReduceOp;

int bps_gpu_device_count(void) {
  int count = 0;
  if (Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount") != 0) return -1;
  return count;
}

const char* bps_gpu_last_error(void) { return bps::last_error.c_str(); }

int bps_gpu_reduce(void* dst, const void* src, size_t count, int dtype, int reduce_op,
                   void* stream) {
  if (count == 0) return 0;
  if (!bps::IsValidReduceOp(static_cast<uint8_t>(reduce_op)))
    return Fail("reduce op " + std::to_string(reduce_op) + " is not one of the core's");
  return bps::ForDataType(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* d = static_cast<T*>(dst);
    const T* s = static_cast<const T*>(src);
    const int blocks = bps::BlocksFor(count);
    cudaStream_t on = bps::StreamOf(stream);
    switch (static_cast<ReduceOp>(reduce_op)) {
      case ReduceOp::kMin:
        bps::ReduceKernel<T, ReduceOp::kMin><<<blocks, bps::kThreads, 0, on>>>(d, s, count);
        break;
      case ReduceOp::kMax:
        bps::ReduceKernel<T, ReduceOp::kMax><<<blocks, bps::kThreads, 0, on>>>(d, s, count);
        break;
      case ReduceOp::kProduct:
        bps::ReduceKernel<T, ReduceOp::kProduct><<<blocks, bps::kThreads, 0, on>>>(d, s, count);
        break;
      default:
        bps::ReduceKernel<T, ReduceOp::kSum><<<blocks, bps::kThreads, 0, on>>>(d, s, count);
    }
    return Check(cudaGetLastError(), "the reduce kernel");
  });
}

int bps_gpu_divide(void* buf, size_t count, int dtype, int divisor, void* stream) {
  if (divisor <= 0) return Fail("divisor " + std::to_string(divisor) + " is not a worker count");
  if (count == 0) return 0;
  return bps::ForDataType(dtype, [&](auto zero) {
    using T = decltype(zero);
    bps::DivideKernel<T><<<bps::BlocksFor(count), bps::kThreads, 0, bps::StreamOf(stream)>>>(
        static_cast<T*>(buf), count, divisor);
    return Check(cudaGetLastError(), "the divide kernel");
  });
}

int bps_gpu_scale(void* buf, size_t count, int dtype, double factor, void* stream) {
  if (count == 0 || factor == 1.0) return 0;
  return bps::ForDataType(dtype, [&](auto zero) {
    using T = decltype(zero);
    bps::ScaleKernel<T><<<bps::BlocksFor(count), bps::kThreads, 0, bps::StreamOf(stream)>>>(
        static_cast<T*>(buf), count, factor);
    return Check(cudaGetLastError(), "the scale kernel");
  });
}

int bps_gpu_compress_fp16(const void* src, void* dst, size_t count, void* stream) {
  if (count == 0) return 0;
  bps::CompressKernel<<<bps::BlocksFor(count), bps::kThreads, 0, bps::StreamOf(stream)>>>(
      static_cast<const float*>(src), static_cast<__half*>(dst), count);
  return Check(cudaGetLastError(), "the fp16 compression kernel");
}

int bps_gpu_decompress_fp16(const void* src, void* dst, size_t count, void* stream) {
  if (count == 0) return 0;
  bps::DecompressKernel<<<bps::BlocksFor(count), bps::kThreads, 0, bps::StreamOf(stream)>>>(
      static_cast<const __half*>(src), static_cast<float*>(dst), count);
  return Check(cudaGetLastError(), "the fp16 decompression kernel");
}
