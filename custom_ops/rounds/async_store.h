// Asynchronous training (BYTEPS_ENABLE_ASYNC, OpKind::kAsyncPushPull): a key holds
// parameters instead of rounds. Rank 0's first push stores them, and every worker's
// first push is answered with them (those that came before rank 0's wait for it); a
// later push is a weight delta, added at once and answered with the parameters to
// its sender alone. Each rank's rounds only ever grow, so no update counts twice.
#ifndef TF_BPS_ROUNDS_ASYNC_STORE_H_
#define TF_BPS_ROUNDS_ASYNC_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "round.h"
#include "round_data.h"

namespace bps {

class AsyncStore {
 public:
  // Whether the key trains asynchronously: its first push was asynchronous.
  bool started() const { return !last_round_.empty(); }
  // The key's first push, from `rank`, sets what the others must match.
  void Start(uint32_t rank, const RoundSpec& spec, int num_workers);
  // Stores or adds `arrival`'s push. Refusals go to `answers`; the pushes to answer
  // with parameters() now (this one, or those that waited for rank 0) are appended
  // to `replies`. True if the push was taken (stored, added, or waiting).
  bool Push(const Arrival& arrival, const RoundSpec& spec, const char* data, BlockPool* pool,
            RoundAnswers* answers, std::vector<Arrival>* replies);
  // Worker `rank` gave up a push: if it was rank 0's first, those waiting for it hear why.
  void GiveUp(uint32_t rank, RoundAnswers* answers);
  // The job fails: the pushes that wait for rank 0 hear `reason`.
  void FailWaiting(const std::string& reason, RoundAnswers* answers);

  const char* parameters() const { return parameters_.data.get(); }
  size_t length() const { return spec_.length; }
  void Release(BlockPool* pool) { pool->Release(std::move(parameters_)); }

 private:
  RoundSpec spec_;
  uint32_t first_rank_ = 0;           // whose push set spec_
  BlockPool::Block parameters_;       // once rank 0's first push arrived
  std::vector<Arrival> waiting_;      // first pushes that came before it
  std::vector<uint32_t> last_round_;  // by rank: the last round it pushed
};

}  // namespace bps

#endif  // TF_BPS_ROUNDS_ASYNC_STORE_H_
