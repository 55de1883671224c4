#include "straggler_watch.h"

#include <sstream>
#include <utility>

#include "../common/logging.h"

namespace bps {

StragglerWatch::StragglerWatch(double window_s, double threshold_ms,
                               std::function<std::string(uint32_t)> describe,
                               std::function<void(const std::vector<uint32_t>&)> judged)
    : window_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(window_s))),
      threshold_ms_(threshold_ms),
      describe_(std::move(describe)),
      judged_(std::move(judged)),
      window_start_(Clock::now()) {}

void StragglerWatch::RoundEnded(uint32_t last_rank, Clock::duration late, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++rounds_;
  Lateness& lateness = last_[last_rank];
  ++lateness.rounds_last;
  lateness.total_ms += std::chrono::duration<double, std::milli>(late).count();
  if (now - window_start_ >= window_) Judge(now);
}

void StragglerWatch::Judge(Clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - window_start_).count();
  std::vector<uint32_t> named;
  for (const auto& [rank, lateness] : last_) {
    const double mean_ms = lateness.total_ms / static_cast<double>(lateness.rounds_last);
    if (2 * lateness.rounds_last <= rounds_ || mean_ms <= threshold_ms_) continue;
    std::ostringstream text;
    text.precision(0);
    text << std::fixed << "straggler: " << describe_(rank) << " arrived last in "
         << lateness.rounds_last << " of the " << rounds_ << " rounds of the last " << seconds
         << " s, on average " << mean_ms << " ms after the round's first push "
         << "(BYTEPS_STRAGGLER_THRESHOLD_MS=" << threshold_ms_ << ")";
    BPS_LOG(kWarning) << text.str();
    named.push_back(rank);
  }
  if (judged_) judged_(named);
  rounds_ = 0;
  last_.clear();
  window_start_ = now;
}

}  // namespace bps
