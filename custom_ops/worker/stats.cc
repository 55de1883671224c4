#include "stats.h"

#include <algorithm>

namespace bps {

const std::array<uint64_t, BPS_STATS_SIZE_CLASSES - 1> WorkerStats::kSizeBounds = {
    4ull << 10, 64ull << 10, 1ull << 20, 16ull << 20, 256ull << 20};
const std::array<double, BPS_STATS_LATENCY_BUCKETS - 1> WorkerStats::kLatencyBounds = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

void WorkerStats::OperationEnded(bool reduction, bool ok, uint64_t tensor_id, size_t bytes,
                                 Clock::duration took) {
  if (!ok) {
    failed_operations_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (!reduction) return;
  const double seconds = std::chrono::duration<double>(took).count();
  const size_t size_class =
      std::lower_bound(kSizeBounds.begin(), kSizeBounds.end(), uint64_t{bytes}) -
      kSizeBounds.begin();
  const size_t bucket =
      std::lower_bound(kLatencyBounds.begin(), kLatencyBounds.end(), seconds) -
      kLatencyBounds.begin();
  latency_counts_[size_class][bucket].fetch_add(1, std::memory_order_relaxed);
  latency_nanos_[size_class].fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()),
      std::memory_order_relaxed);
  uint64_t expected = kNoTensor;
  if (step_tensor_.compare_exchange_strong(expected, tensor_id) || expected == tensor_id)
    StepEnded();
}

void WorkerStats::StepEnded() {
  const Clock::time_point now = Clock::now();
  const double unix_now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(step_mutex_);
  if (steps_ > 0) {
    last_step_seconds_ = std::chrono::duration<double>(now - last_step_).count();
    step_seconds_sum_ += last_step_seconds_;
  }
  ++steps_;
  last_step_ = now;
  last_step_unix_ = unix_now;
}

void WorkerStats::Read(bps_worker_stats* out) const {
  *out = bps_worker_stats{};
  out->pushed_bytes = pushed_bytes_.load(std::memory_order_relaxed);
  out->pushed_raw_bytes = pushed_raw_bytes_.load(std::memory_order_relaxed);
  out->pulled_bytes = pulled_bytes_.load(std::memory_order_relaxed);
  out->failed_operations = failed_operations_.load(std::memory_order_relaxed);
  for (size_t c = 0; c < latency_counts_.size(); ++c) {
    for (size_t b = 0; b < latency_counts_[c].size(); ++b)
      out->push_pull_counts[c][b] = latency_counts_[c][b].load(std::memory_order_relaxed);
    out->push_pull_seconds[c] = static_cast<double>(latency_nanos_[c].load()) * 1e-9;
  }
  std::lock_guard<std::mutex> lock(step_mutex_);
  out->steps = steps_;
  out->step_seconds_sum = step_seconds_sum_;
  out->last_step_seconds = last_step_seconds_;
  out->last_step_time = last_step_unix_;
}

}  // namespace bps
