// The partitions a worker sent and whose answers it awaits, from a server (one table
// per ServerLink) or from the host's workers that merge them (LocalMerge): what an
// answer is matched against, and what fails when the peer or the time runs out.
// Both read an answer the same way (ReadAnswer).
#ifndef TF_BPS_WORKER_PENDING_H_
#define TF_BPS_WORKER_PENDING_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/common.h"
#include "../compression/registry.h"
#include "../wire/transport.h"
#include "task.h"

namespace bps {

// A partition sent (or queued to be sent) and not yet answered: the partition itself,
// so that it can be sent again elsewhere (Worker::MoveLostServer), and its progress.
struct PendingPartition : PartitionTask {
  // `partition`, sent to `peer`.
  static PendingPartition Of(const PartitionTask& partition, int peer = 0);

  int peer = 0;           // who answers it (a local merge: the leader's local index)
  bool credited = false;  // pushed: its credit returns with the answer or the failure
  int64_t sent_at = 0;    // when its push ended, if the timeline traces it
};

class PendingTable {
 public:
  void Add(PendingPartition partition);
  // Takes the partition that `header` answers, from `peer`; false for an unknown one
  // or another round (an answer to a task that already failed: never used).
  bool Take(const FrameHeader& header, int peer, PendingPartition* partition);
  // Runs `change` on `task`'s partition `part` if it still waits; false if it does not.
  bool Update(const std::shared_ptr<Task>& task, uint32_t part,
              const std::function<void(PendingPartition&)>& change);
  // Takes every partition for which `which` holds (all of them without it).
  std::vector<PendingPartition> TakeIf(
      const std::function<bool(const PendingPartition&)>& which = nullptr);
  // The partitions whose task's time ran out by `now` (they stay).
  std::vector<PendingPartition> Expired(std::chrono::steady_clock::time_point now);

 private:
  std::mutex mutex_;
  std::unordered_map<PartitionKey, PendingPartition, PartitionKeyHash> pending_;
};

// An answer's error frame, read whole so that the stream stays in step; the error is
// `*error`. A non-OK return means the stream itself broke (or `from` sent too much).
Status ReadAnswerError(const FrameHeader& header, DataReader* payload, const std::string& from,
                       Status* error);
// Reads a reply's data into its task's output, after checking its length; `finish`
// (may be empty) runs on the data before the partition counts as done. A reply for a
// task that failed meanwhile is skipped. A non-OK return: the stream broke.
// `raw`: a server's answer, which a reduction still averages and scales (on the host
// in `finish`, on a device once copied there: Delivered); else a finished result.
// `compression`: the reply is the partition in that compressed form (a server's answer
// to a compressed push_pull), checked and decompressed into the output.
Status ReadAnswer(const FrameHeader& header, DataReader* payload, const PendingPartition& pending,
                  const std::string& from, bool raw,
                  const std::function<void(void*, size_t)>& finish,
                  const CompressionSetup* compression = nullptr);

}  // namespace bps

#endif  // TF_BPS_WORKER_PENDING_H_
