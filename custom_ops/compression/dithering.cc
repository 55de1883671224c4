// dithering (QSGD's stochastic quantisation, BytePS's dithering compressor) with s = k
// levels:
//   float32 norm: max |x| (normalize=max) or sqrt(sum x^2) (normalize=l2);
//   n int8 level indices in [-s, s], the element's sign on its level.
// a = |x| / norm rounds at random to one of the two levels lo <= a <= hi around it, up
// with probability (a - lo) / (hi - lo), so that a decompressed element's mean is x.
// Levels: l / s (partition=linear), or 0 and 2^-(s-l) for l = 1..s (partition=natural).
// The random numbers: Random(seed, stream, round)'s, one per element in order; element
// i rounds up when (number_i >> 40) * 2^-24 is below its probability.
//
// An input with a NaN or an infinity gets a norm that is not finite (and every index 0):
// Valid refuses it, so it is seen rather than sent as numbers.
#include <cmath>
#include <cstring>

#include "internal.h"

namespace bps {
namespace compression {
namespace {

using Partition = CompressorSpec::Partition;

constexpr size_t kChunk = 1024;  // Elements whose random numbers are drawn at once.

// uniform[i]: the upper 24 bits of the i-th number drawn from `state` (Random's
// sequence, computed at once), a uniform number in [0, 1) times 2^24.
BPS_COMPRESSION_VECTORISE void DrawUniforms(uint64_t state, size_t count, int32_t* uniform) {
  for (size_t i = 0; i < count; ++i)
    uniform[i] = static_cast<int32_t>(SplitMix(state + i * kGoldenGamma) >> 40);
}

// a <= 1: no |x| is above max |x|, nor above sqrt(sum x^2) rounded (every rounding on
// the way is monotonic); the level is capped at s all the same, on integers (a
// conditional on floats would keep the loop from vectorising).
//
// Linear levels l / s. a * s is exact in double (24 bits times 7), and so is the
// fraction above its floor: the probability of rounding up, exactly. (No product is
// rounded, so contracting one into an FMA changes nothing.)
BPS_COMPRESSION_VECTORISE void QuantiseLinear(const float* in, size_t count, float norm, int levels,
                                              const int32_t* uniform, int8_t* out) {
  for (size_t i = 0; i < count; ++i) {
    const float a = std::fabs(in[i]) / norm;
    const double position = static_cast<double>(a) * levels;
    const int lower = static_cast<int>(position);
    const double fraction = position - lower;
    int level = lower + static_cast<int>(uniform[i] * 0x1p-24 < fraction);
    level = level < levels ? level : levels;
    out[i] = static_cast<int8_t>(BitsOf(in[i]) >> 31 ? -level : level);
  }
}

// Natural levels 2^(l - s): a = 2^(e-1) * (1 + f) between 2^(e-1) and 2^e rounds up with
// probability f, its mantissa bits; below the smallest level 2^-(s-1), up to it with
// probability a * 2^(s-1). Both exact.
BPS_COMPRESSION_VECTORISE void QuantiseNatural(const float* in, size_t count, float norm,
                                               int levels, const int32_t* uniform, int8_t* out) {
  const float bottom_scale = std::ldexp(1.0f, levels - 1);
  for (size_t i = 0; i < count; ++i) {
    const float a = std::fabs(in[i]) / norm;
    const uint32_t bits = BitsOf(a);
    const int level = levels + static_cast<int>(bits >> 23) - 127;  // a's lower level
    const float mantissa = FloatOf((bits & 0x7fffffu) | 0x3f800000u) - 1.0f;
    // Chosen by a mask, so that the product is not moved into a branch.
    const uint32_t upper = 0u - static_cast<uint32_t>(level >= 1);
    const float fraction =
        FloatOf((BitsOf(mantissa) & upper) | (BitsOf(a * bottom_scale) & ~upper));
    const int lower = level >= 1 ? level : 0;
    int rounded = lower + static_cast<int>(static_cast<float>(uniform[i]) * 0x1p-24f < fraction);
    rounded = rounded < levels ? rounded : levels;
    out[i] = static_cast<int8_t>(BitsOf(in[i]) >> 31 ? -rounded : rounded);
  }
}

class Dithering final : public Compressor {
 public:
  explicit Dithering(const CompressorSpec& spec)
      : levels_(static_cast<int>(spec.k)),
        natural_(spec.partition == Partition::kNatural),
        l2_(spec.normalize == CompressorSpec::Normalize::kL2),
        seed_(spec.seed) {
    // signed_levels_[uint8_t(i)]: index i's signed level value, for i in [-s, s].
    for (int i = -levels_; i <= levels_; ++i) {
      const int l = i < 0 ? -i : i;
      float value = natural_ ? (l == 0 ? 0.0f : std::ldexp(1.0f, l - levels_))
                             : static_cast<float>(l) / static_cast<float>(levels_);
      signed_levels_[static_cast<uint8_t>(static_cast<int8_t>(i))] = i < 0 ? -value : value;
    }
  }

  size_t CompressedBytes(size_t n) const override { return 4 + n; }

  void Compress(const float* in, size_t n, uint64_t stream, uint32_t round,
                char* out) const override {
    const float norm =
        l2_ ? static_cast<float>(std::sqrt(SumOfSquares(in, n))) : FloatOf(MaxMagnitudeBits(in, n));
    StoreF32(out, norm);
    int8_t* indices = reinterpret_cast<int8_t*>(out + 4);
    if (!(norm > 0 && std::isfinite(norm))) {
      std::memset(indices, 0, n);
      return;
    }
    const uint64_t state = RandomState(seed_, stream, round);
    int32_t uniform[kChunk];
    for (size_t start = 0; start < n; start += kChunk) {
      const size_t count = n - start < kChunk ? n - start : kChunk;
      DrawUniforms(state + start * kGoldenGamma, count, uniform);
      if (natural_) {
        QuantiseNatural(in + start, count, norm, levels_, uniform, indices + start);
      } else {
        QuantiseLinear(in + start, count, norm, levels_, uniform, indices + start);
      }
    }
  }

  void Decompress(const char* in, size_t n, float* out) const override {
    const float norm = LoadF32(in);
    const uint8_t* indices = reinterpret_cast<const uint8_t*>(in + 4);
    for (size_t i = 0; i < n; ++i) out[i] = signed_levels_[indices[i]] * norm;
  }

  void DecompressAdd(const char* in, size_t n, float* out) const override {
    const float norm = LoadF32(in);
    const uint8_t* indices = reinterpret_cast<const uint8_t*>(in + 4);
    for (size_t i = 0; i < n; ++i) out[i] += signed_levels_[indices[i]] * norm;
  }

  bool Valid(const char* in, size_t n) const override {
    const float norm = LoadF32(in);
    if (!(std::isfinite(norm) && norm >= 0)) return false;
    const int8_t* indices = reinterpret_cast<const int8_t*>(in + 4);
    bool valid = true;
    for (size_t i = 0; i < n; ++i) valid &= indices[i] >= -levels_ && indices[i] <= levels_;
    return valid;
  }

 private:
  const int levels_;
  const bool natural_, l2_;
  const uint64_t seed_;
  float signed_levels_[256] = {};
};

}  // namespace

std::unique_ptr<Compressor> MakeDithering(const CompressorSpec& spec) {
  return std::make_unique<Dithering>(spec);
}

}  // namespace compression
}  // namespace bps
