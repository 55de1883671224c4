// What the compressors' files share and nothing else includes: their factories, the
// random numbers every worker draws alike, and loads and stores of the wire's
// little-endian, possibly unaligned words.
#ifndef TF_BPS_COMPRESSION_INTERNAL_H_
#define TF_BPS_COMPRESSION_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "compressor.h"

// Hot loops are compiled twice, for AVX2 CPUs and for baseline x86-64, as
// custom_ops/common/reduce.cc's. Only loops whose results do not depend on it (integer
// work, additions): FMA contraction would change a product's rounding.
#if defined(__x86_64__) && defined(__GNUC__)
#define BPS_COMPRESSION_VECTORISE __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define BPS_COMPRESSION_VECTORISE
#endif

namespace bps {
namespace compression {

std::unique_ptr<Compressor> MakeOnebit(const CompressorSpec& spec);
std::unique_ptr<Compressor> MakeTopk(const CompressorSpec& spec);
std::unique_ptr<Compressor> MakeRandomk(const CompressorSpec& spec);
std::unique_ptr<Compressor> MakeDithering(const CompressorSpec& spec);
std::unique_ptr<Compressor> MakeFp16(const CompressorSpec& spec);

// splitmix64 (Steele, Lea, Flood): the generator adds the golden gamma to its state and
// returns the state's finalised mix.
constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ULL;

inline uint64_t SplitMix(uint64_t state) {
  uint64_t z = state + kGoldenGamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The state for one partition (`stream`) of one round: every worker that passes the
// same three numbers draws the same sequence.
inline uint64_t RandomState(uint64_t seed, uint64_t stream, uint32_t round) {
  return SplitMix(SplitMix(SplitMix(seed) ^ stream) ^ round);
}

// The i-th number drawn (from 0) is SplitMix(state + i * kGoldenGamma).
class Random {
 public:
  Random(uint64_t seed, uint64_t stream, uint32_t round)
      : state_(RandomState(seed, stream, round)) {}
  uint64_t Next() {
    const uint64_t out = SplitMix(state_);
    state_ += kGoldenGamma;
    return out;
  }
  // Uniform in [0, range) (range >= 1), unbiased (Lemire's multiply and reject).
  uint64_t Below(uint64_t range) {
    unsigned __int128 product = static_cast<unsigned __int128>(Next()) * range;
    if (static_cast<uint64_t>(product) < range) {
      const uint64_t floor = (0 - range) % range;  // 2^64 mod range
      while (static_cast<uint64_t>(product) < floor)
        product = static_cast<unsigned __int128>(Next()) * range;
    }
    return static_cast<uint64_t>(product >> 64);
  }

 private:
  uint64_t state_;
};

// The wire is little-endian, as x86-64 and AArch64 Linux are.
inline uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreU32(char* p, uint32_t v) { std::memcpy(p, &v, sizeof(v)); }
inline float LoadF32(const char* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreF32(char* p, float v) { std::memcpy(p, &v, sizeof(v)); }
inline uint32_t BitsOf(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}
inline float FloatOf(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// Sums in double over eight lanes (element i into lane i % 8, each lane in order, then
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))): the same on every CPU, and
// several times faster than one chain of additions.
double SumOfMagnitudes(const float* in, size_t n);
double SumOfSquares(const float* in, size_t n);
// The largest |x| as bits: a NaN beats every number, so it shows.
uint32_t MaxMagnitudeBits(const float* in, size_t n);

}  // namespace compression
}  // namespace bps

#endif  // TF_BPS_COMPRESSION_INTERNAL_H_
