// Gradient compression (BytePS's compressors): what turns one partition of a
// float32 gradient into the bytes that travel, and back.
//
// Both legs compress, as in BytePS: a worker compresses its push (after the local
// merge), the server decompresses every push, sums them, and compresses the sum for
// the pull. Each side keeps, per partition, the state that makes a lossy compressor
// converge (CompressionState: error feedback, momentum).
//
// Compressed forms have a size fixed by the spec and the element count
// (CompressedBytes), so a receiver checks a push's length before it reads anything.
// Every form is little-endian, as the rest of the wire.
#ifndef TF_BPS_COMPRESSION_COMPRESSOR_H_
#define TF_BPS_COMPRESSION_COMPRESSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../common/common.h"

namespace bps {

// What the user chose (bps.Compression.topk(...), BytePS's compression_params), as every
// worker and the server agree on it. Text form: see ParseCompressorSpec.
struct CompressorSpec {
  enum class Kind : uint8_t { kNone = 0, kOnebit, kTopk, kRandomk, kDithering, kFp16 };
  enum class Partition : uint8_t { kLinear = 0, kNatural };
  enum class Normalize : uint8_t { kMax = 0, kL2 };

  Kind kind = Kind::kNone;
  bool scaling = false;  // onebit: multiply the signs by the mean magnitude
  // topk, randomk: below 1 a fraction of the elements, else a count; dithering: levels.
  double k = 0;
  Partition partition = Partition::kLinear;  // dithering
  Normalize normalize = Normalize::kMax;     // dithering
  bool error_feedback = false;               // ef="vanilla"
  bool nesterov = false;                     // momentum="nesterov"
  double mu = 0.9;                           // momentum's factor
  uint64_t seed = 0;                         // randomk, dithering: every worker's the same

  bool compresses() const { return kind != Kind::kNone; }
  // Every field alike (ParseCompressorSpec leaves the fields a kind does not use at
  // their defaults, so two parsed specs are equal when they mean the same).
  bool operator==(const CompressorSpec& other) const;
  bool operator!=(const CompressorSpec& other) const { return !(*this == other); }
};

// The name a spec's text starts with: "none", "onebit", "topk", "randomk", "dithering",
// "fp16".
const char* CompressorName(CompressorSpec::Kind kind);

// How many elements topk and randomk send of `n`: k < 1 is a fraction,
// max(1, floor(k * n)); k >= 1 a count, min(n, floor(k)); none of none (n = 0).
size_t SparseCount(double k, size_t n);

// Parses "topk k=0.01 ef=vanilla momentum=nesterov mu=0.9 seed=7": the compressor's
// name, then key=value pairs (BytePS's keys: scaling, k, partition, normalize, ef,
// momentum, mu, seed). An unknown name or key, a value out of range, or a key the
// compressor does not take is an error naming it. "" and "none" are kNone.
// topk, randomk and dithering require k; mu goes with momentum=nesterov only; a key
// comes at most once. Errors are kInvalidArgument, "compression: k=0 must be > 0
// (topk)"; `spec` is left as it was.
Status ParseCompressorSpec(const std::string& text, CompressorSpec* spec);
// The canonical text of a spec (what ParseCompressorSpec reads back): every worker's
// declaration carries it, so equal specs give equal signatures. The name, then every
// key the kind uses in the order scaling, k, partition, normalize, ef, momentum, mu (with
// nesterov), seed; numbers in the fewest digits that read back exactly.
std::string FormatCompressorSpec(const CompressorSpec& spec);

// A stateless transform of `n` float32 elements. Thread-safe: const methods only.
class Compressor {
 public:
  virtual ~Compressor() = default;
  // Bytes of the compressed form of `n` elements.
  virtual size_t CompressedBytes(size_t n) const = 0;
  // Writes the compressed form of `in` (n elements) to `out` (CompressedBytes(n)).
  // `stream` and `round` seed the random choices (randomk's indices, dithering's
  // rounding): the same on every worker for one partition of one round, so that
  // randomk's workers choose the same elements.
  virtual void Compress(const float* in, size_t n, uint64_t stream, uint32_t round,
                        char* out) const = 0;
  // Writes the n elements `in` stands for to `out`.
  virtual void Decompress(const char* in, size_t n, float* out) const = 0;
  // Adds the n elements `in` stands for to `out` (a server's sum).
  virtual void DecompressAdd(const char* in, size_t n, float* out) const;
  // Whether `in` (CompressedBytes(n) bytes, from a stranger perhaps) is well formed:
  // indices in range, finite scales. Decompress trusts only what this accepted.
  virtual bool Valid(const char* in, size_t n) const = 0;
};

// The compressor of a spec that compresses; null for kNone. topk and randomk send
// uint32 indices: a partition they compress holds fewer than 2^32 elements.
std::unique_ptr<Compressor> MakeCompressor(const CompressorSpec& spec);

// One partition's compression on one side, with the spec's momentum and error
// feedback (BytePS's vanilla error feedback, Nesterov momentum):
//   m = mu * m + g;  g' = g + mu * m              (momentum="nesterov")
//   e = g' + residual * residual_scale;  c = C(e);  residual = e - D(c)   (ef)
// `residual_scale` is lr_before / lr_now when the learning rate changed (1 otherwise),
// so the residual keeps meaning the same step. Not thread-safe: one per partition, used
// by one thread at a time. `compressor` (not null) is MakeCompressor(spec)'s and outlives
// the state.
class CompressionState {
 public:
  CompressionState(const CompressorSpec& spec, const Compressor* compressor, size_t n);
  void Compress(const float* in, uint64_t stream, uint32_t round, double residual_scale, char* out);
  const std::vector<float>& residual() const { return residual_; }

 private:
  const CompressorSpec spec_;
  const Compressor* const compressor_;
  const size_t n_;
  std::vector<float> momentum_;  // empty without momentum
  std::vector<float> residual_;  // empty without error feedback
  std::vector<float> work_;      // g', then e = g' + residual (D(C(e)) goes to residual_)
};

}  // namespace bps

#endif  // TF_BPS_COMPRESSION_COMPRESSOR_H_
