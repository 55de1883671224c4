// onebit (signSGD with a scale, BytePS's onebit compressor): each element's sign as one
// bit, and one magnitude for them all.
//   ceil(n / 32) uint32 words: bit i of word w is element 32w + i's sign bit (set when
//   negative, -0.0 included);
//   float32 scale: the mean |x| with scaling, else 1.
// An element decompresses to -scale or +scale.
#include <cmath>

#include "internal.h"

namespace bps {
namespace compression {
namespace {

size_t Words(size_t n) { return (n + 31) / 32; }

BPS_COMPRESSION_VECTORISE void PackSigns(const float* in, size_t n, char* out) {
  const size_t whole = n / 32;
  for (size_t w = 0; w < whole; ++w) {
    uint32_t word = 0;
    for (uint32_t i = 0; i < 32; ++i) word |= (BitsOf(in[32 * w + i]) >> 31) << i;
    StoreU32(out + 4 * w, word);
  }
  if (n % 32 != 0) {
    uint32_t word = 0;
    for (uint32_t i = 0; i < n % 32; ++i) word |= (BitsOf(in[32 * whole + i]) >> 31) << i;
    StoreU32(out + 4 * whole, word);
  }
}

// out[i] = (or +=) -scale where element i's bit is set, else +scale.
template <bool kAdd>
BPS_COMPRESSION_VECTORISE void UnpackSigns(const char* in, size_t n, float scale, float* out) {
  // The sign bit set onto the scale's bits: ±scale with no branch (a scale of -0.0,
  // which Valid lets through, counts as +0.0).
  const uint32_t scale_bits = BitsOf(scale) & 0x7fffffffu;
  for (size_t w = 0; w < Words(n); ++w) {
    const uint32_t word = LoadU32(in + 4 * w);
    const size_t count = n - 32 * w < 32 ? n - 32 * w : 32;
    float* dst = out + 32 * w;
    for (uint32_t i = 0; i < count; ++i) {
      const float value = FloatOf(scale_bits | (((word >> i) & 1u) << 31));
      if constexpr (kAdd) {
        dst[i] += value;
      } else {
        dst[i] = value;
      }
    }
  }
}

class Onebit final : public Compressor {
 public:
  explicit Onebit(bool scaling) : scaling_(scaling) {}

  size_t CompressedBytes(size_t n) const override { return 4 * Words(n) + 4; }

  void Compress(const float* in, size_t n, uint64_t, uint32_t, char* out) const override {
    PackSigns(in, n, out);
    float scale = 1.0f;
    if (scaling_) scale = n == 0 ? 0.0f : static_cast<float>(SumOfMagnitudes(in, n) / n);
    StoreF32(out + 4 * Words(n), scale);
  }

  void Decompress(const char* in, size_t n, float* out) const override {
    UnpackSigns<false>(in, n, LoadF32(in + 4 * Words(n)), out);
  }

  void DecompressAdd(const char* in, size_t n, float* out) const override {
    UnpackSigns<true>(in, n, LoadF32(in + 4 * Words(n)), out);
  }

  bool Valid(const char* in, size_t n) const override {
    const float scale = LoadF32(in + 4 * Words(n));
    return std::isfinite(scale) && scale >= 0;
  }

 private:
  const bool scaling_;
};

}  // namespace

std::unique_ptr<Compressor> MakeOnebit(const CompressorSpec& spec) {
  return std::make_unique<Onebit>(spec.scaling);
}

}  // namespace compression
}  // namespace bps
