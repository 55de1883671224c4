// Hierarchical local merge, the BytePS way: the workers of one host first sum each
// push_pull partition among themselves; one of them, the partition's leader, pushes
// the host's sum to the server (flagged kFlagHostMerged, so the server counts it for
// every worker of the host) and hands the result back to the others. A server then
// receives one copy of each partition per host instead of one per worker, and the
// leaders are spread over the host's workers by (tensor id + partition), so no one
// worker carries all of the host's network traffic.
//
// The stage sits between planning and the server links:
//   caller thread     a partition the worker leads waits here for its peers' copies;
//                     one led by a peer goes to the local push stage
//   local push stage  sends a contribution to its leader (shared memory: one copy
//                     into a slot, the leader sums straight from it)
//   peer receivers    one thread per peer: contributions, results, errors, joins
// A leader's merged partition travels to the server as a task of its own, through
// the worker's server links, and its completion sends the result to the peers.
//
// Peers talk over LocalPeers (local_peers.h): data crosses as shared-memory locations.
//
// A leader keeps each partition's rounds in a Round (rounds/round.h), as a server
// does: it never mixes rounds, refuses a contribution after its round ended with the
// reason the round ended, ends a round for everyone when a worker gives it up (its
// operation failed), and does not wait for a worker that joined (bps.join). Joins are
// told apart by epoch:
// each worker counts the joins it has seen complete, so a contribution made after a
// join is never taken for one made before it.
#ifndef TF_BPS_WORKER_LOCAL_MERGE_H_
#define TF_BPS_WORKER_LOCAL_MERGE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../common/common.h"
#include "../rounds/declarations.h"
#include "../rounds/round.h"
#include "../wire/protocol.h"
#include "../wire/transport.h"
#include "local_peers.h"
#include "pending.h"
#include "stage.h"
#include "task.h"
#include "timeline.h"

namespace bps {

class LocalMerge : private Roster, private LocalPeers::Receiver {
 public:
  // What the merge reports to, and asks of, the worker that owns it: its only way up.
  class Owner {
   public:
    virtual ~Owner() = default;
    // The worker's timeline: never null, recording or not (timeline.h).
    virtual Timeline* timeline() const = 0;
    // A peer's connection broke: the worker fails with `reason`.
    virtual void OnLinkFailure(const std::string& reason) = 0;
    // Logs `bytes` of the tensor's values at `stage` when it is BYTEPS_DEBUG_SAMPLE_TENSOR's.
    virtual void Sample(const std::string& name, uint64_t tensor_id, uint32_t round, DataType dtype,
                        const char* stage, const void* data, size_t bytes) const = 0;
    // The group of an operation in the global set: every worker.
    virtual Group GlobalGroup() const = 0;
    // Sends a host's summed partition on to its server.
    virtual void SendToServer(PartitionTask partition) = 0;
    // Tells every server this worker gave up `round` of the tensor.
    virtual void AbandonAtServers(uint64_t tensor_id, uint32_t round, OpKind kind) = 0;
  };

  // `slots`: where this worker stages shared memory (the worker's, shared with its
  // server links).
  LocalMerge(Owner* owner, LocalMergeOptions options, std::shared_ptr<SharedSlots> slots);
  ~LocalMerge();

  // Connects to every other worker of this host (each listens; lower local indices
  // accept, higher ones connect). `cancel` ends the wait for slow peers.
  Status Start(Cancellation* cancel);
  // Whether `task`'s partitions go through the merge: push_pull in the global set.
  bool Merges(const Task& task) const;
  // Takes one partition of such a task instead of a server link.
  void Contribute(PartitionTask partition);
  // Tells the host's other workers about a task that does not merge (a broadcast, an
  // operation in a process set): a leader waiting for this worker's push_pull of the
  // same tensor and round then fails it as a mismatch instead of waiting in vain.
  void Announce(const std::shared_ptr<Task>& task);
  // This worker's `task` failed: its partitions leave their rounds, which end for
  // the other workers of the host too.
  void Abandon(uint64_t tensor_id, uint32_t round);
  // This worker's operation failed before its partition `part` reached the leader (it
  // held a NaN, say): the round ends for the host's other workers.
  void AbandonUnsent(const Task& task, uint32_t part);
  // This worker joins (bps.join): its peers stop waiting for it.
  void BeginJoin();
  // Every worker joined: the next operations belong to the next epoch.
  void EndJoin();
  void FailExpired(std::chrono::steady_clock::time_point now);
  void FailPending(const Status& reason);
  // Says Bye to the peers and ends the threads.
  void Close();
  // Where the device merge's frames go (device_merge.h); set before Start.
  using FrameHandler = std::function<Status(int index, const FrameHeader&, DataReader*)>;
  void set_merge_frames(FrameHandler handler) { merge_frames_ = std::move(handler); }
  // Sends a frame to the host's worker of local index `index`.
  Status SendToPeer(int index, const FrameHeader& header, const std::string& payload);

 private:
  class MergePort;
  // A worker's slots for the local merge (copies 0 and 1 of a partition are its
  // server links'): what it staged for a leader, and a leader's merged partition
  // (which its peers then read the result from).
  static constexpr uint32_t kStagedCopy = 2;
  static constexpr uint32_t kMergedCopy = 3;
  // Whether an operation goes through the merge: push_pull of data in the global set.
  static bool MergesOp(const Declaration& op);
  // One partition at its leader: its rounds, and the merge of the one in progress.
  struct MergeState {
    Round round;
    uint64_t signature = 0;  // of the round's first contribution
    size_t length = 0;
    std::vector<const char*> inputs;  // by local index; null until it arrived
    std::shared_ptr<Task> own;        // this worker's task, if it contributed
    size_t own_offset = 0;            // of the partition in its output
    uint64_t priority = 0;
    int64_t own_arrived_at = 0;      // when this worker contributed, if the timeline traces it
    Declaration op;                  // of the first contributor
    std::shared_ptr<Task> upstream;  // the merged push, once on its way to the server
    char* sum = nullptr;             // where the merge and then the result lie
  };
  // What a locked step decided and runs once the lock is released: peers' frames,
  // task completions, merged pushes to start. Sending or completing a task under the
  // lock could wait on a peer that waits on us.
  struct Effects {
    struct Message {
      int peer;
      FrameHeader header;
      std::string payload;         // a frame's payload, or
      const char* data = nullptr;  // a result in shared memory (header.length bytes)
    };
    struct Delivery {
      std::shared_ptr<Task> task;
      size_t offset;
      const char* data;
      size_t length;
    };
    std::vector<Message> messages;
    std::vector<std::pair<std::shared_ptr<Task>, Status>> failures;
    std::vector<Delivery> deliveries;
    std::vector<std::pair<std::shared_ptr<Task>, PartitionTask>> upstream;
    std::vector<std::pair<uint64_t, uint32_t>> abandoned;  // (tensor, round) at the servers
  };
  // The timeline if one of its recordings took `task`, else null.
  Timeline* TracerFor(const Task& task) const;

  int LeaderOf(uint64_t tensor_id, uint32_t part) const;
  // When the partition went to its leader, for its BROADCAST stage on the timeline.
  void MarkSent(const PartitionTask& partition, int64_t at);
  bool SendToLeader(PartitionTask& partition);
  // LocalPeers::Receiver
  Status OnFrame(int index, const FrameHeader& header, DataReader* payload) override;
  void OnPeerGone(int index, const std::string& failure) override;
  Status HandleResult(int index, const FrameHeader& header, DataReader* payload);
  // Ends `key`'s round that worker `arrival.rank` gave up (needs merge_mutex_).
  void GiveUp(const PartitionKey& key, const Arrival& arrival, Effects* effects);

  // Locked steps (merge_mutex_).
  // Local worker `index`'s contribution (`push` as its frame describes it), or this
  // worker's own (`own`).
  void Arrive(int index, const FrameHeader& push, const char* data, const PartitionTask* own,
              Effects* effects);
  void MaybeMerge(const PartitionKey& key, MergeState* state, Effects* effects);
  // A frame to local peer `peer` about one partition's round, queued in `effects`.
  Effects::Message& Queue(Effects* effects, int peer, FrameType type, const PartitionKey& key,
                          uint32_t round) const;
  void QueueError(Effects* effects, int peer, const PartitionKey& key, uint32_t round,
                  ErrorKind kind, const std::string& text) const;
  void RecheckAll(Effects* effects);
  // Fails the tensor's rounds that wait for worker `index` when what it declared for
  // that round does not merge with them (and that worker's operation).
  void CheckAgreement(uint64_t tensor_id, int index, Effects* effects);
  void CheckAgreement(const PartitionKey& key, MergeState* state, int index, Effects* effects);
  // This worker's announced task of the tensor, if it is in `round` and alive.
  std::shared_ptr<Task> Announced(uint64_t tensor_id, uint32_t round);
  // Roster: who of the host joined or shut down.
  bool Joined(uint32_t rank, uint16_t epoch) const override;
  bool Gone(uint32_t rank) const override;
  uint32_t own_rank() const { return static_cast<uint32_t>(options_.rank); }
  uint32_t RankOf(int index) const { return members_[index]; }
  int IndexOf(uint32_t rank) const;
  // The merged push came back (or failed).
  void OnUpstreamDone(const PartitionKey& key, uint32_t round, const Status& status);
  void Run(Effects& effects);

  Owner* const owner_;
  const LocalMergeOptions options_;
  int index_ = 0;                  // of this worker among options_.ranks
  std::vector<uint32_t> members_;  // options_.ranks: the host's workers, ascending
  const std::shared_ptr<SharedSlots> slots_;
  LocalPeers peers_;
  Stage<PartitionTask, PartitionTaskOrder> push_stage_{"local push"};

  std::mutex merge_mutex_;
  std::unordered_map<PartitionKey, MergeState, PartitionKeyHash> merges_;
  // What each worker of the host (this one too) last declared, and for which round.
  DeclarationBook declarations_;
  uint16_t epoch_ = 0;
  std::vector<int> joined_epoch_;  // by local index: the epoch it joined in; -1: not joined
  std::vector<bool> finished_;     // by local index: said Bye
  PendingTable pending_;           // what this worker pushed to its leaders
  // This worker's latest operation per tensor that does not merge (see Announce).
  std::unordered_map<uint64_t, std::weak_ptr<Task>> announced_;
  bool closing_ = false;
  FrameHandler merge_frames_;
};

}  // namespace bps

#endif  // TF_BPS_WORKER_LOCAL_MERGE_H_
