// Push_pull and reducescatter rounds: socket pushes are reduced into the first one as
// they arrive; pushes in shared memory are read where they lie, once, at the end.
#include "../common/reduce.h"
#include "policy.h"

namespace bps {
namespace {

class Reduce : public RoundPolicy {
 public:
  void Open(RoundData* data, int) const override { data->by_rank.clear(); }

  void Add(RoundData* data, uint32_t, Contribution push, BlockPool* pool) const override {
    const auto dtype = static_cast<DataType>(data->spec.dtype);
    if (push.shared) {
      data->shared.push_back(push.shared);
    } else if (!data->sum.data) {
      data->sum = std::move(push.block);
    } else {
      ReduceInto(data->spec.reduce_op, dtype, data->sum.data.get(), push.block.data.get(),
                 data->spec.length / DataTypeSize(dtype));
      pool->Release(std::move(push.block));
    }
  }

  const char* Result(RoundData* data, const ResultContext&, ResultMemory* memory,
                     size_t* length) const override {
    const RoundSpec& spec = data->spec;
    *length = spec.length;
    if (data->shared.empty()) return data->sum.data.get();  // Reduced as the pushes came in.
    char* out = memory->Shared(spec.length);
    if (!out) return nullptr;
    std::vector<const char*> inputs = data->shared;
    if (data->sum.data) inputs.insert(inputs.begin(), data->sum.data.get());
    const auto dtype = static_cast<DataType>(spec.dtype);
    ReduceAll(spec.reduce_op, dtype, out, inputs, spec.length / DataTypeSize(dtype));
    return out;
  }
};

}  // namespace

const RoundPolicy& ReducePolicy() {
  static const Reduce policy;
  return policy;
}

}  // namespace bps
