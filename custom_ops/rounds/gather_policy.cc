// Allgather and alltoall rounds. The sizes step (partition kSizesPart) returns every
// member's row count, then what each pushed (an alltoall's splits); the data steps
// return the rows, in the group's order.
#include <cstring>

#include "policy.h"

namespace bps {
namespace {

class Gather : public ByRankPolicy {
 public:
  const char* Result(RoundData* data, const ResultContext& context, ResultMemory* memory,
                     size_t* length) const override {
    const std::vector<uint32_t>& members = *context.members;
    const int size = static_cast<int>(members.size());
    const bool sizes = context.part == kSizesPart;
    *length = sizes ? AllgatherTableBytes(size) : 0;
    const Contribution* only = nullptr;
    int pieces = 0;
    for (const Contribution& c : data->by_rank) {
      *length += c.length;
      if (c.length) {
        ++pieces;
        only = &c;
      }
    }
    // An allgather partition holds one worker's rows: they go out from where they
    // arrived, but to same-host workers from the server's memory (as a broadcast's).
    if (!sizes && pieces <= 1 && !(only && context.local_reader)) return only ? only->data() : "";
    char* out = context.local_reader ? memory->Shared(*length) : memory->Private(*length);
    if (!out) return nullptr;
    char* cursor = out;
    if (sizes) {
      for (int i = 0; i < size; ++i)
        std::memcpy(out + i * sizeof(int64_t), &data->by_rank[members[i]].rows, sizeof(int64_t));
      cursor += AllgatherTableBytes(size);
    }
    for (uint32_t member : members) {
      const Contribution& c = data->by_rank[member];
      if (c.length) std::memcpy(cursor, c.data(), c.length);
      cursor += c.length;
    }
    return out;
  }
};

}  // namespace

const RoundPolicy& GatherPolicy() {
  static const Gather policy;
  return policy;
}

}  // namespace bps
