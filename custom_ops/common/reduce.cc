#include "reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>

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
struct BFloat16 {
  uint16_t bits;
};

inline float ToFloat(BFloat16 value) {
  uint32_t bits = static_cast<uint32_t>(value.bits) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline BFloat16 FromFloat(float value, BFloat16) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((bits >> 16) | 0x40)};
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return {static_cast<uint16_t>(bits >> 16)};
}

// Half precision computes in float, as TensorFlow's CPU kernels do.
inline float ToFloat(_Float16 value) { return static_cast<float>(value); }
inline _Float16 FromFloat(float value, _Float16) { return static_cast<_Float16>(value); }

// How a storage type computes: itself, or float for the 16-bit floats.
template <typename T>
struct Arith {
  using Compute = T;
  static Compute In(T value) { return value; }
  static T Out(Compute value) { return value; }
};
template <>
struct Arith<_Float16> {
  using Compute = float;
  static float In(_Float16 value) { return ToFloat(value); }
  static _Float16 Out(float value) { return FromFloat(value, _Float16{}); }
};
template <>
struct Arith<BFloat16> {
  using Compute = float;
  static float In(BFloat16 value) { return ToFloat(value); }
  static BFloat16 Out(float value) { return FromFloat(value, BFloat16{}); }
};

struct SumOp {
  template <typename C>
  static C Apply(C a, C b) {
    return a + b;
  }
};
struct MinOp {
  template <typename C>
  static C Apply(C a, C b) {
    return std::min(a, b);
  }
};
struct MaxOp {
  template <typename C>
  static C Apply(C a, C b) {
    return std::max(a, b);
  }
};
struct ProductOp {
  template <typename C>
  static C Apply(C a, C b) {
    return a * b;
  }
};

template <typename T, typename Op>
BPS_VECTORISE void CombineLoop(T* __restrict dst, const T* __restrict a, const T* __restrict b,
                               size_t count) {
  using A = Arith<T>;
  for (size_t i = 0; i < count; ++i) dst[i] = A::Out(Op::Apply(A::In(a[i]), A::In(b[i])));
}

// In place: dst is also the first operand, so it cannot be declared __restrict with it.
template <typename T, typename Op>
BPS_VECTORISE void CombineIntoLoop(T* __restrict dst, const T* __restrict src, size_t count) {
  using A = Arith<T>;
  for (size_t i = 0; i < count; ++i) dst[i] = A::Out(Op::Apply(A::In(dst[i]), A::In(src[i])));
}

template <typename T>
BPS_VECTORISE void ScaleLoop(T* buf, size_t count, double factor) {
  using A = Arith<T>;
  using C = typename A::Compute;
  if constexpr (std::is_floating_point_v<C>) {
    // Multiplying by the reciprocal is several times cheaper than dividing and differs
    // from division by at most one unit in the last place (Horovod scales the same way).
    const C f = static_cast<C>(factor);
    for (size_t i = 0; i < count; ++i) buf[i] = A::Out(A::In(buf[i]) * f);
  } else {
    for (size_t i = 0; i < count; ++i)
      buf[i] = static_cast<T>(static_cast<double>(buf[i]) * factor);
  }
}

template <typename T>
void FloorDivideLoop(T* buf, size_t count, T divisor) {
  for (size_t i = 0; i < count; ++i) {
    T q = buf[i] / divisor;
    if ((buf[i] % divisor != 0) && ((buf[i] < 0) != (divisor < 0))) --q;
    buf[i] = q;
  }
}

// Calls fn(T{}) with T the storage type of `dtype`; bool is never dispatched here.
template <typename Fn>
void Dispatch(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat16:
      return fn(_Float16{});
    case DataType::kBFloat16:
      return fn(BFloat16{});
    case DataType::kFloat32:
      return fn(float{});
    case DataType::kFloat64:
      return fn(double{});
    case DataType::kInt32:
      return fn(int32_t{});
    case DataType::kInt64:
      return fn(int64_t{});
    case DataType::kUint8:
      return fn(uint8_t{});
    case DataType::kInt8:
      return fn(int8_t{});
    case DataType::kUint16:
      return fn(uint16_t{});
    case DataType::kInt16:
      return fn(int16_t{});
    case DataType::kBool:
      return;
  }
}

template <typename T>
void Combine(ReduceOp op, T* dst, const T* a, const T* b, size_t count) {
  const bool in_place = dst == a;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return in_place ? CombineIntoLoop<T, SumOp>(dst, b, count)
                      : CombineLoop<T, SumOp>(dst, a, b, count);
    case ReduceOp::kMin:
      return in_place ? CombineIntoLoop<T, MinOp>(dst, b, count)
                      : CombineLoop<T, MinOp>(dst, a, b, count);
    case ReduceOp::kMax:
      return in_place ? CombineIntoLoop<T, MaxOp>(dst, b, count)
                      : CombineLoop<T, MaxOp>(dst, a, b, count);
    case ReduceOp::kProduct:
      return in_place ? CombineIntoLoop<T, ProductOp>(dst, b, count)
                      : CombineLoop<T, ProductOp>(dst, a, b, count);
  }
}

}  // namespace

bool CanReduce(DataType dtype) { return dtype != DataType::kBool; }

void ReduceInto(ReduceOp op, DataType dtype, void* dst, const void* src, size_t count) {
  ReduceOf(op, dtype, dst, dst, src, count);
}

void ReduceOf(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, size_t count) {
  Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    Combine<T>(op, static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count);
  });
}

void ReduceAll(ReduceOp op, DataType dtype, void* dst, const std::vector<const char*>& inputs,
               size_t count) {
  if (inputs.empty()) return;
  if (inputs.size() == 1) {
    std::memcpy(dst, inputs[0], count * DataTypeSize(dtype));
    return;
  }
  ReduceOf(op, dtype, dst, inputs[0], inputs[1], count);
  for (size_t i = 2; i < inputs.size(); ++i) ReduceInto(op, dtype, dst, inputs[i], count);
}

void DivideInPlace(DataType dtype, void* buf, size_t count, int divisor) {
  if (divisor == 1) return;
  Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      FloorDivideLoop(static_cast<T*>(buf), count, static_cast<T>(divisor));
    } else {
      ScaleLoop(static_cast<T*>(buf), count, 1.0 / divisor);
    }
  });
}

bool AllFinite(DataType dtype, const void* data, size_t count) {
  // Half-precision types hold NaN and Inf as an exponent of all ones: test the bits.
  auto exponent_clear = [&](uint16_t mask) {
    const uint16_t* bits = static_cast<const uint16_t*>(data);
    bool finite = true;
    for (size_t i = 0; i < count; ++i) finite &= (bits[i] & mask) != mask;
    return finite;
  };
  auto all_finite = [&](auto* values) {
    bool finite = true;
    for (size_t i = 0; i < count; ++i) finite &= std::isfinite(values[i]);
    return finite;
  };
  switch (dtype) {
    case DataType::kFloat16:
      return exponent_clear(0x7C00);
    case DataType::kBFloat16:
      return exponent_clear(0x7F80);
    case DataType::kFloat32:
      return all_finite(static_cast<const float*>(data));
    case DataType::kFloat64:
      return all_finite(static_cast<const double*>(data));
    default:
      return true;
  }
}

std::string SampleText(DataType dtype, const void* data, size_t count) {
  constexpr size_t kShown = 8;
  std::ostringstream text;
  text.precision(7);
  double sum = 0;
  text << "first [";
  // Bool is one byte per element, as uint8.
  Dispatch(dtype == DataType::kBool ? DataType::kUint8 : dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* values = static_cast<const T*>(data);
    for (size_t i = 0; i < count; ++i) {
      const double value = static_cast<double>(Arith<T>::In(values[i]));
      sum += value;
      if (i < kShown) text << (i ? ", " : "") << value;
    }
  });
  text << (count > kShown ? ", ...] sum " : "] sum ") << sum << " of " << count << " elements";
  return text.str();
}

void ScaleInPlace(DataType dtype, void* buf, size_t count, double factor) {
  if (factor == 1.0) return;
  Dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    ScaleLoop(static_cast<T*>(buf), count, factor);
  });
}

}  // namespace bps
