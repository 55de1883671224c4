// What a server process counts for Prometheus (BYTEPS_METRICS_PORT, metrics_endpoint.h),
// over its whole life: one ServerMetrics outlives the Server of each job generation, so
// its counters only grow. Everything is a fixed set of atomics plus one entry per worker
// rank ever served: nothing grows with the number of pushes or rounds.
//
// The hot path (readers, engines) only adds to atomics; the per-rank entries are reached
// through the stable pointers Ranks() hands each generation, so no push takes a lock.
// Only Ranks() and Render() take the mutex that guards the table of entries.
#ifndef TF_BPS_SERVER_SERVER_METRICS_H_
#define TF_BPS_SERVER_SERVER_METRICS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bps {

class ServerMetrics {
 public:
  // One worker rank's figures.
  struct Rank {
    // Its pushes that took part in a round, and how long after the round's first push
    // they arrived, summed (nanoseconds): Prometheus' summary _count and _sum.
    std::atomic<uint64_t> pushes{0};
    std::atomic<uint64_t> late_ns{0};
    // Named by the straggler watch in the window it judged last.
    std::atomic<bool> straggler{false};

    void PushArrived(std::chrono::steady_clock::duration late) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(late).count();
      late_ns.fetch_add(ns > 0 ? static_cast<uint64_t>(ns) : 0, std::memory_order_relaxed);
      pushes.fetch_add(1, std::memory_order_relaxed);
    }
  };

  // Payload bytes of the frames read from workers, and of those sent to them.
  void Received(uint64_t bytes) { received_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  void Sent(uint64_t bytes) { sent_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  // A round (of one partition key) ended with its result sent. Release: a scrape that
  // sees the round sees its pushes and replies counted too (Render reads it first).
  void RoundFinished() { rounds_.fetch_add(1, std::memory_order_release); }
  // Items were queued for the engine threads (`delta` > 0) or taken or dropped (< 0).
  void Queued(int64_t delta) { queue_depth_.fetch_add(delta, std::memory_order_relaxed); }

  // A generation starts serving `num_workers` workers (its address book's): the entries
  // of ranks 0 .. num_workers - 1, stable for the life of this object, with nobody
  // named a straggler yet.
  std::vector<Rank*> Ranks(int num_workers);

  // The Prometheus text exposition (format 0.0.4) of everything above.
  std::string Render() const;

 private:
  std::atomic<uint64_t> received_bytes_{0};
  std::atomic<uint64_t> sent_bytes_{0};
  std::atomic<uint64_t> rounds_{0};
  std::atomic<int64_t> queue_depth_{0};
  std::atomic<int> workers_{0};
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Rank>> ranks_;  // by rank; only grows
};

}  // namespace bps

#endif  // TF_BPS_SERVER_SERVER_METRICS_H_
