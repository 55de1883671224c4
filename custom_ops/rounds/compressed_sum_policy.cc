// Compressed push_pull rounds (BytePS's both-leg compression): the server's readers
// decompress each push as it arrives (server.cc), so the round sums float32 partitions
// as a plain push_pull does; the sum is then compressed once, with the key's own error
// feedback, and every worker receives the same compressed bytes.
#include "policy.h"

namespace bps {
namespace {

class CompressedSum : public RoundPolicy {
 public:
  void Open(RoundData* data, int num_workers) const override {
    ReducePolicy().Open(data, num_workers);
  }

  void Add(RoundData* data, uint32_t rank, Contribution push, BlockPool* pool) const override {
    ReducePolicy().Add(data, rank, std::move(push), pool);
  }

  const char* Result(RoundData* data, const ResultContext& context, ResultMemory* memory,
                     size_t* length) const override {
    // Pushes arrive in blocks (decompressed by the reader), never in shared memory:
    // the sum is the first push's block.
    const float* sum = reinterpret_cast<const float*>(data->sum.data.get());
    const Compressor& compressor = *data->spec.compression->compressor;
    const size_t n = data->spec.length / sizeof(float);
    *length = compressor.CompressedBytes(n);
    char* out = context.local_reader ? memory->Shared(*length) : memory->Private(*length);
    if (!out || !sum) return nullptr;
    context.result_compression->Compress(sum, context.stream, context.round, 1.0, out);
    return out;
  }
};

}  // namespace

const RoundPolicy& CompressedSumPolicy() {
  static const CompressedSum policy;
  return policy;
}

}  // namespace bps
