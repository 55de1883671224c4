#include "policy.h"

namespace bps {

const RoundPolicy& PolicyFor(OpKind kind) {
  switch (kind) {
    case OpKind::kBroadcast:
      return BroadcastPolicy();
    case OpKind::kAllgather:
    case OpKind::kAlltoall:
      return GatherPolicy();
    default:
      return ReducePolicy();
  }
}

}  // namespace bps
