// Names a worker that keeps arriving last. Every round a server ends with pushes from
// several workers tells the watch who came last and how long after the round's first
// push; over each window (BYTEPS_STRAGGLER_WINDOW_SECONDS) a worker that came last in
// more than half of the rounds, on average later than BYTEPS_STRAGGLER_THRESHOLD_MS, is
// named in a warning with its address and how late it was. The arrival times are the
// server's own: no message on the hot path.
//
// Shared by the server's engine threads, which report under one short lock per round.
#ifndef TF_BPS_SERVER_STRAGGLER_WATCH_H_
#define TF_BPS_SERVER_STRAGGLER_WATCH_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace bps {

class StragglerWatch {
 public:
  using Clock = std::chrono::steady_clock;
  // `describe(rank)` names a worker in the warning ("worker rank 1 (10.0.0.2:41234)").
  // `judged(ranks)`, if given, hears the ranks named at the end of each window (none,
  // often), under the watch's lock: it must not call back into the watch.
  StragglerWatch(double window_s, double threshold_ms,
                 std::function<std::string(uint32_t)> describe,
                 std::function<void(const std::vector<uint32_t>&)> judged = nullptr);

  // A round ended; `last_rank` completed it, `late` after the round's first push.
  void RoundEnded(uint32_t last_rank, Clock::duration late, Clock::time_point now);

 private:
  struct Lateness {
    uint64_t rounds_last = 0;
    double total_ms = 0;
  };
  // Warns about the window's stragglers and starts a new window (holds mutex_).
  void Judge(Clock::time_point now);

  const Clock::duration window_;
  const double threshold_ms_;
  const std::function<std::string(uint32_t)> describe_;
  const std::function<void(const std::vector<uint32_t>&)> judged_;
  std::mutex mutex_;
  Clock::time_point window_start_;
  uint64_t rounds_ = 0;
  std::map<uint32_t, Lateness> last_;
};

}  // namespace bps

#endif  // TF_BPS_SERVER_STRAGGLER_WATCH_H_
