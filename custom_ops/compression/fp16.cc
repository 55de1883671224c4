// fp16: n IEEE half floats, rounded to nearest even (BytePS's fp16 compressor). The
// conversions are integer work on the bits (after Fabian Giesen's), which the compiler
// vectorises; x86-64's baseline has no conversion instruction.
#include "internal.h"

namespace bps {
namespace compression {
namespace {

// float -> half, rounding to nearest even; a NaN stays a (quiet) NaN of its sign. Each
// case is computed and one chosen without a branch, so that the loop vectorises.
inline uint16_t ToHalf(float value) {
  const uint32_t bits = BitsOf(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  // A normal half: rebias the exponent (127 -> 15; 0xc8000000 = (15 - 127) << 23) and
  // round the 13 bits that go by adding just under half of them, plus the lowest bit
  // kept, so that a tie rounds to even.
  const uint32_t normal = (magnitude + 0xc8000fffu + ((magnitude >> 13) & 1u)) >> 13;
  // Below 2^-14, a subnormal half or zero: adding 0.5 leaves the half's bits, rounded to
  // nearest even, at the bottom of the sum's mantissa. (A float subnormal gives 0
  // either way, so flushing it to zero changes nothing.)
  const uint32_t subnormal = BitsOf(FloatOf(magnitude) + 0.5f) - 0x3f000000u;
  // From 65520 up: infinity; NaN stays NaN.
  const uint32_t special = magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // Chosen by masks: a conditional would let the compiler move the float addition into
  // a branch, which it then may not vectorise (the addition could trap).
  const uint32_t small = 0u - static_cast<uint32_t>(magnitude < 0x38800000u);
  const uint32_t large = 0u - static_cast<uint32_t>(magnitude >= 0x47800000u);
  const uint32_t half = (special & large) | (((subnormal & small) | (normal & ~small)) & ~large);
  return static_cast<uint16_t>(half | sign);
}

// half -> float, exactly.
inline float FromHalf(uint16_t half) {
  const uint32_t shifted = static_cast<uint32_t>(half & 0x7fffu) << 13;  // exponent, mantissa
  const uint32_t exponent = shifted & 0x0f800000u;
  const uint32_t normal = shifted + ((127 - 15) << 23);
  const uint32_t special = normal + ((128 - 16) << 23);  // Infinity or NaN.
  // Zero or subnormal: normalised through float arithmetic (2^-14 * 1.m - 2^-14).
  const uint32_t subnormal = BitsOf(FloatOf(normal + (1u << 23)) - FloatOf(113u << 23));
  const uint32_t top = 0u - static_cast<uint32_t>(exponent == 0x0f800000u);
  const uint32_t bottom = 0u - static_cast<uint32_t>(exponent == 0);
  const uint32_t bits = (subnormal & bottom) | (((special & top) | (normal & ~top)) & ~bottom);
  return FloatOf(bits | (static_cast<uint32_t>(half & 0x8000u) << 16));
}

BPS_COMPRESSION_VECTORISE void ToHalves(const float* in, size_t n, char* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t half = ToHalf(in[i]);
    std::memcpy(out + 2 * i, &half, 2);
  }
}

template <bool kAdd>
BPS_COMPRESSION_VECTORISE void FromHalves(const char* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t half;
    std::memcpy(&half, in + 2 * i, 2);
    if constexpr (kAdd) {
      out[i] += FromHalf(half);
    } else {
      out[i] = FromHalf(half);
    }
  }
}

class Fp16 final : public Compressor {
 public:
  size_t CompressedBytes(size_t n) const override { return 2 * n; }
  void Compress(const float* in, size_t n, uint64_t, uint32_t, char* out) const override {
    ToHalves(in, n, out);
  }
  void Decompress(const char* in, size_t n, float* out) const override {
    FromHalves<false>(in, n, out);
  }
  void DecompressAdd(const char* in, size_t n, float* out) const override {
    FromHalves<true>(in, n, out);
  }
  bool Valid(const char*, size_t) const override { return true; }
};

}  // namespace

std::unique_ptr<Compressor> MakeFp16(const CompressorSpec&) { return std::make_unique<Fp16>(); }

}  // namespace compression
}  // namespace bps
