// What a worker process has done, for its metrics endpoint (tf_bps/runtime/metrics.py
// reads it through bps_worker_read_stats): its steps, the bytes it pushed to and pulled
// from the servers, and how long its push_pulls took by size.
//
// A step is a round of the job's step tensor: the first tensor whose reduction this
// worker finished. A training step reduces every gradient once, so that tensor's
// rounds are the steps, as BytePS's timeline counts them.
//
// One per process, kept across the worker engines an elastic job makes as it re-forms,
// so that its counters never go back. Every core thread reports here: counters are
// relaxed atomics, and the step's times take one short lock per finished operation.
// Its size is fixed: nothing here grows with the number of calls.
#ifndef TF_BPS_WORKER_STATS_H_
#define TF_BPS_WORKER_STATS_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "c_api.h"

namespace bps {

class WorkerStats {
 public:
  using Clock = std::chrono::steady_clock;

  // Partitions went to a server: `wire_bytes` as sent, `raw_bytes` before compression.
  void Pushed(size_t wire_bytes, size_t raw_bytes) {
    pushed_bytes_.fetch_add(wire_bytes, std::memory_order_relaxed);
    pushed_raw_bytes_.fetch_add(raw_bytes, std::memory_order_relaxed);
  }
  // An answer of `bytes` came from a server.
  void Pulled(size_t bytes) { pulled_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  // An operation ended: a reduction of `bytes` input bytes on `tensor_id`, that took
  // `took`; `reduction` false for the other kinds, which count only when they fail.
  void OperationEnded(bool reduction, bool ok, uint64_t tensor_id, size_t bytes,
                      Clock::duration took);

  void Read(bps_worker_stats* out) const;

  // The upper bounds of the size classes (bytes) and of the latency buckets
  // (seconds); the last class and bucket have none.
  static const std::array<uint64_t, BPS_STATS_SIZE_CLASSES - 1> kSizeBounds;
  static const std::array<double, BPS_STATS_LATENCY_BUCKETS - 1> kLatencyBounds;

 private:
  void StepEnded();

  std::atomic<uint64_t> pushed_bytes_{0};
  std::atomic<uint64_t> pushed_raw_bytes_{0};
  std::atomic<uint64_t> pulled_bytes_{0};
  std::atomic<uint64_t> failed_operations_{0};
  std::array<std::array<std::atomic<uint64_t>, BPS_STATS_LATENCY_BUCKETS>, BPS_STATS_SIZE_CLASSES>
      latency_counts_{};
  // Nanoseconds by size class.
  std::array<std::atomic<uint64_t>, BPS_STATS_SIZE_CLASSES> latency_nanos_{};

  static constexpr uint64_t kNoTensor = ~uint64_t{0};
  std::atomic<uint64_t> step_tensor_{kNoTensor};
  mutable std::mutex step_mutex_;
  uint64_t steps_ = 0;
  Clock::time_point last_step_;
  double step_seconds_sum_ = 0;
  double last_step_seconds_ = 0;
  double last_step_unix_ = 0;
};

}  // namespace bps

#endif  // TF_BPS_WORKER_STATS_H_
