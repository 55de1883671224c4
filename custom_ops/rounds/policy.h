// What a server does with the pushes of one operation kind's round, and whom it
// answers with the result: one policy per kind, each in its own file
// (reduce_policy.cc, broadcast_policy.cc, gather_policy.cc). The round itself (who
// is in, whether it may end) is the Round's; the policy only holds and combines data.
#ifndef TF_BPS_ROUNDS_POLICY_H_
#define TF_BPS_ROUNDS_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../compression/compressor.h"
#include "round_data.h"

namespace bps {

// Where a result goes when it is not one push's own data.
class ResultMemory {
 public:
  virtual ~ResultMemory() = default;
  // `length` bytes in the server's shared memory, which same-host workers read the
  // result from; null when it ran out (the server then fails).
  virtual char* Shared(size_t length) = 0;
  // `length` bytes in a block the round holds until it ends.
  virtual char* Private(size_t length) = 0;
};

// What a policy needs to know about the round besides its data.
struct ResultContext {
  uint32_t part = 0;
  const std::vector<uint32_t>* members = nullptr;  // ascending: the group's order
  bool local_reader = false;                       // a same-host worker receives the result
  uint32_t round = 0;
  // Compressed push_pull: the key's state for compressing results (error feedback),
  // and the stream that seeds the compressor's random choices.
  CompressionState* result_compression = nullptr;
  uint64_t stream = 0;
};

class RoundPolicy {
 public:
  virtual ~RoundPolicy() = default;
  // Prepares the data of a round opened for a job of `num_workers`.
  virtual void Open(RoundData* data, int num_workers) const = 0;
  // Keeps (or combines) worker `rank`'s push.
  virtual void Add(RoundData* data, uint32_t rank, Contribution push, BlockPool* pool) const = 0;
  // Empty if the round can end once every member is in or excused; else why not.
  virtual std::string Unfinishable(const RoundData&, const std::string& /*tensor*/) const {
    return "";
  }
  // The round's result in one buffer (`*length` bytes); null when memory ran out.
  virtual const char* Result(RoundData* data, const ResultContext& context, ResultMemory* memory,
                             size_t* length) const = 0;
  // Whether worker `rank` receives the result; the others get an empty acknowledgement.
  // By default: the round's owner, or everyone without one.
  virtual bool Receives(const RoundData& data, uint32_t rank) const {
    return data.spec.owner < 0 || static_cast<int32_t>(rank) == data.spec.owner;
  }
};

// The policies that keep each worker's push apart, by rank (broadcast, gathers).
class ByRankPolicy : public RoundPolicy {
 public:
  void Open(RoundData* data, int num_workers) const override;
  void Add(RoundData* data, uint32_t rank, Contribution push, BlockPool* pool) const override;
};

// Each kind's policy, named in its row of op_kinds.def: ReducePolicy (push_pull and
// reducescatter: an element-wise reduction of every push), CompressedSumPolicy (the sum
// of the decompressed pushes, compressed for the reply), BroadcastPolicy (the root's push
// is the result, for every other worker), GatherPolicy (allgather and alltoall: every
// worker's rows, in rank order, behind a table of sizes).
#define BPS_OP_KIND(name, c_name, value, text, worker_policy, server_policy) \
  const RoundPolicy& server_policy();
#include "../wire/op_kinds.def"
#undef BPS_OP_KIND

// The policy of a synchronous operation kind (kAsyncPushPull's goes unused: AsyncStore
// runs it).
const RoundPolicy& PolicyFor(OpKind kind);

}  // namespace bps

#endif  // TF_BPS_ROUNDS_POLICY_H_
