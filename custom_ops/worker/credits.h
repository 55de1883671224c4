// The scheduling credit (BYTEPS_SCHEDULING_CREDIT): how much a worker may have pushed
// to one server without its answer back.
//
// Without a limit every worker pours all its partitions into the server's link at
// once. TCP shares a congested link between flows very unevenly, so one worker's
// copies arrive long before another's, every sum waits for its last copy, and the
// server's sending direction idles until the end. With a few partitions in flight per
// worker, a worker that is ahead waits for the sums, which need the others' copies:
// the workers move through the partitions together, and sums flow back while the next
// partitions arrive. Waiting partitions leave in priority order, so a small urgent
// tensor overtakes a large one queued earlier (BytePS's priority scheduling).
//
// A limit must never turn into a deadlock between workers that queued the same
// partitions in different orders (each holding credit for rounds that wait for the
// other's push). Two rules prevent it:
//  - a partition ordered before everything in flight always goes: every worker agrees
//    on the order of declared tensors, so the first partition anyone waits for is
//    pushed by everyone;
//  - a link that got no answer and pushed nothing for kPatience lets its next
//    partition go anyway (workers whose orders disagree, a straggler that has not
//    queued its partitions yet): the limit then costs time, never progress.
#ifndef TF_BPS_WORKER_CREDITS_H_
#define TF_BPS_WORKER_CREDITS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>

namespace bps {

class PushCredits {
 public:
  static constexpr std::chrono::milliseconds kPatience{1000};

  // `limit`: bytes in flight; 0 lifts the limit.
  explicit PushCredits(size_t limit) : limit_(limit) {}

  // True if a push of `bytes` at `priority` (lower goes first) may go now; its credit
  // is then taken and must be returned once its answer arrives or it is abandoned.
  bool TryTake(uint64_t priority, size_t bytes);
  // Returns a push's credit; its answer arrived (progress), or it failed.
  void Return(uint64_t priority, size_t bytes);

  size_t in_flight() const;

 private:
  using Clock = std::chrono::steady_clock;
  void TakeLocked(uint64_t priority, size_t bytes);

  const size_t limit_;
  mutable std::mutex mutex_;
  size_t in_flight_ = 0;
  std::multiset<uint64_t> priorities_;  // of the pushes in flight
  Clock::time_point last_progress_ = Clock::now();
};

}  // namespace bps

#endif  // TF_BPS_WORKER_CREDITS_H_
