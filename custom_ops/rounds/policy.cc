#include "policy.h"

namespace bps {

void ByRankPolicy::Open(RoundData* data, int num_workers) const {
  data->by_rank.clear();
  data->by_rank.resize(num_workers);
}

void ByRankPolicy::Add(RoundData* data, uint32_t rank, Contribution push, BlockPool*) const {
  data->by_rank[rank] = std::move(push);
}

const RoundPolicy& PolicyFor(OpKind kind) {
  switch (kind) {
    case OpKind::kBroadcast:
      return BroadcastPolicy();
    case OpKind::kAllgather:
    case OpKind::kAlltoall:
      return GatherPolicy();
    case OpKind::kCompressedPushPull:
      return CompressedSumPolicy();
    default:
      return ReducePolicy();
  }
}

}  // namespace bps
