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
#define BPS_OP_KIND(name, c_name, value, text, worker_policy, server_policy) \
  case OpKind::k##name:                                                       \
    return server_policy();
#include "../wire/op_kinds.def"
#undef BPS_OP_KIND
  }
  // Only a byte that IsValidOpKind refused could get here, and none is let in.
  return ReducePolicy();
}

}  // namespace bps
