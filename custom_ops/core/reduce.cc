#include "reduce.h"

#include <cstdint>
#include <cstring>

// Each loop is compiled twice, for AVX2/FMA CPUs and for baseline x86-64, and the
// loader picks one; the CI machine and users' servers differ.
#if defined(__x86_64__) && defined(__GNUC__)
#define BPS_VECTORISE __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define BPS_VECTORISE
#endif

namespace bps {
namespace {

// bfloat16 is the upper half of a float32; converting back rounds to nearest even.
inline float BFloat16ToFloat(uint16_t value) {
  uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline uint16_t FloatToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
BPS_VECTORISE void SumLoop(T* __restrict dst, const T* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] += src[i];
}

template <typename T>
BPS_VECTORISE void SumOfLoop(T* __restrict dst, const T* __restrict a, const T* __restrict b,
                             size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = a[i] + b[i];
}

BPS_VECTORISE void SumOfHalf(_Float16* __restrict dst, const _Float16* __restrict a,
                             const _Float16* __restrict b, size_t count) {
  for (size_t i = 0; i < count; ++i)
    dst[i] = static_cast<_Float16>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

BPS_VECTORISE void SumOfBFloat16(uint16_t* __restrict dst, const uint16_t* __restrict a,
                                 const uint16_t* __restrict b, size_t count) {
  for (size_t i = 0; i < count; ++i)
    dst[i] = FloatToBFloat16(BFloat16ToFloat(a[i]) + BFloat16ToFloat(b[i]));
}

BPS_VECTORISE void SumHalf(_Float16* __restrict dst, const _Float16* __restrict src,
                           size_t count) {
  for (size_t i = 0; i < count; ++i)
    dst[i] = static_cast<_Float16>(static_cast<float>(dst[i]) + static_cast<float>(src[i]));
}

BPS_VECTORISE void SumBFloat16(uint16_t* __restrict dst, const uint16_t* __restrict src,
                               size_t count) {
  for (size_t i = 0; i < count; ++i)
    dst[i] = FloatToBFloat16(BFloat16ToFloat(dst[i]) + BFloat16ToFloat(src[i]));
}

// Multiplying by the reciprocal is several times cheaper than dividing and differs
// from division by at most one unit in the last place (Horovod scales the same way).
template <typename T>
BPS_VECTORISE void ScaleFloatLoop(T* buf, size_t count, T factor) {
  for (size_t i = 0; i < count; ++i) buf[i] *= factor;
}

template <typename T>
void DivideIntLoop(T* buf, size_t count, T divisor) {
  for (size_t i = 0; i < count; ++i) {
    T q = buf[i] / divisor;
    if ((buf[i] % divisor != 0) && ((buf[i] < 0) != (divisor < 0))) --q;
    buf[i] = q;
  }
}

BPS_VECTORISE void ScaleHalf(_Float16* buf, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i)
    buf[i] = static_cast<_Float16>(static_cast<float>(buf[i]) * factor);
}

BPS_VECTORISE void ScaleBFloat16(uint16_t* buf, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i) buf[i] = FloatToBFloat16(BFloat16ToFloat(buf[i]) * factor);
}

}  // namespace

void SumInto(DataType dtype, void* dst, const void* src, size_t count) {
  switch (dtype) {
    case DataType::kFloat16:
      SumHalf(static_cast<_Float16*>(dst), static_cast<const _Float16*>(src), count);
      return;
    case DataType::kBFloat16:
      SumBFloat16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count);
      return;
    case DataType::kFloat32:
      SumLoop(static_cast<float*>(dst), static_cast<const float*>(src), count);
      return;
    case DataType::kFloat64:
      SumLoop(static_cast<double*>(dst), static_cast<const double*>(src), count);
      return;
    case DataType::kInt32:
      SumLoop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count);
      return;
    case DataType::kInt64:
      SumLoop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count);
      return;
  }
}

void SumOf(DataType dtype, void* dst, const void* a, const void* b, size_t count) {
  switch (dtype) {
    case DataType::kFloat16:
      SumOfHalf(static_cast<_Float16*>(dst), static_cast<const _Float16*>(a),
                static_cast<const _Float16*>(b), count);
      return;
    case DataType::kBFloat16:
      SumOfBFloat16(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                    static_cast<const uint16_t*>(b), count);
      return;
    case DataType::kFloat32:
      SumOfLoop(static_cast<float*>(dst), static_cast<const float*>(a),
                static_cast<const float*>(b), count);
      return;
    case DataType::kFloat64:
      SumOfLoop(static_cast<double*>(dst), static_cast<const double*>(a),
                static_cast<const double*>(b), count);
      return;
    case DataType::kInt32:
      SumOfLoop(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                static_cast<const int32_t*>(b), count);
      return;
    case DataType::kInt64:
      SumOfLoop(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                static_cast<const int64_t*>(b), count);
      return;
  }
}

void DivideInPlace(DataType dtype, void* buf, size_t count, int divisor) {
  if (divisor == 1) return;
  switch (dtype) {
    case DataType::kFloat16:
      ScaleHalf(static_cast<_Float16*>(buf), count, 1.0f / static_cast<float>(divisor));
      return;
    case DataType::kBFloat16:
      ScaleBFloat16(static_cast<uint16_t*>(buf), count, 1.0f / static_cast<float>(divisor));
      return;
    case DataType::kFloat32:
      ScaleFloatLoop(static_cast<float*>(buf), count, 1.0f / static_cast<float>(divisor));
      return;
    case DataType::kFloat64:
      ScaleFloatLoop(static_cast<double*>(buf), count, 1.0 / static_cast<double>(divisor));
      return;
    case DataType::kInt32:
      DivideIntLoop(static_cast<int32_t*>(buf), count, static_cast<int32_t>(divisor));
      return;
    case DataType::kInt64:
      DivideIntLoop(static_cast<int64_t*>(buf), count, static_cast<int64_t>(divisor));
      return;
  }
}

}  // namespace bps
