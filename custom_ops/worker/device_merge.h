// The local merge of tensors in device memory, BytePS's way: the host's workers sum
// each push_pull partition onto its leader's device with the device's collectives
// (NCCL on GPUs; a grouped reduce), the leader copies the host's sum to the host,
// pushes it to its server (flagged kFlagHostMerged, as the host merge's leaders do,
// local_merge.h) and copies the answer back, and a grouped broadcast from the leaders
// hands every worker the whole result. Partition p's leader is the host merge's
// (LocalLeader), so servers see the same traffic either way.
//
// The collectives need every member to queue the same ones in the same order, which
// the workers' own order of operations does not give. So local index 0 orders them:
// each worker says an operation is ready for a phase (kReduce when it is enqueued,
// kBroadcast once the answers of the partitions it leads are back or the operation
// failed); once every worker has, index 0 numbers it and tells everyone (a Go), and
// each worker queues collectives strictly in that numbering. A Go may also send one
// operation, or every one from then on, through the host merge instead, or fail it on
// every worker alike (a mismatch, a worker that never came, a failure somewhere).
//
// The collectives are used only where they can run: a device table with groups, NCCL
// loaded, one device per worker. Otherwise index 0 decides at the first operation that
// device tensors merge on the host, and says why in the log; an operation whose data
// type the collectives lack, or one during a join (bps.join), merges on the host too.
//
// Threads: Submit on the caller's thread; frames on the peers' receiving threads; one
// ordering thread queues the collectives in order (opening the group blocks it until
// every member has); copies and collectives complete on Devices' completion thread.
#ifndef TF_BPS_WORKER_DEVICE_MERGE_H_
#define TF_BPS_WORKER_DEVICE_MERGE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../common/common.h"
#include "../wire/protocol.h"
#include "../wire/transport.h"
#include "device.h"
#include "task.h"

namespace bps {

class DeviceMerge {
 public:
  // What the merge asks of the worker that owns it.
  class Owner {
   public:
    virtual ~Owner() = default;
    // The operation goes through the host merge after all (device staging, LocalMerge).
    virtual void RunOnHost(std::shared_ptr<Task> task, std::vector<PartitionTask> plan) = 0;
    // A host's sum this worker leads goes to its server.
    virtual void SendToServer(PartitionTask partition) = 0;
    // Partitions this worker leads that will never be pushed: their servers end the round.
    virtual void AbandonPushes(const Task& task, const std::vector<PartitionTask>& plan) = 0;
    // PERSEUS_ALLREDUCE_NANCHECK on a host's sum this worker leads (OK when off).
    virtual Status CheckFinite(const Task& task, const void* data, size_t bytes) const = 0;
    // Sends a frame to the host's worker of local index `index`.
    virtual Status SendToPeer(int index, const FrameHeader& header, const std::string& payload) = 0;
  };
  // The phases of an operation that the group's members go through in step.
  enum Phase : uint32_t { kReduce = 0, kBroadcast = 1, kJoinBegins = 2, kJoinEnds = 3 };
  // What a Go says of an operation's phase: run its collectives (opening the group
  // first), merge it on the host (and, kHostForGood, every operation after it), or fail
  // it.
  enum Verdict : uint8_t { kGroup = 0, kOpenGroup = 1, kHost = 2, kFail = 3, kHostForGood = 4 };

  // `members`: the host's workers' ranks, ascending; this one is `index` of them.
  DeviceMerge(Owner* owner, std::shared_ptr<Devices> devices, std::vector<uint32_t> members,
              int index, int timeout_ms);
  ~DeviceMerge();

  // Hands `task` (a push_pull of device memory that the host merges) to the merge,
  // launched with `plan`: it runs on the devices, or goes back through RunOnHost.
  void Submit(std::shared_ptr<Task> task, std::vector<PartitionTask> plan);
  // kMergeReady and kMergeGo frames from the host's worker `index`.
  Status OnFrame(int index, const FrameHeader& header, DataReader* payload);
  // This worker joins (bps.join): operations that wait for it merge on the host.
  void BeginJoin() { Ready(kJoinBegins, nullptr, ""); }
  void EndJoin() { Ready(kJoinEnds, nullptr, ""); }
  void FailExpired(std::chrono::steady_clock::time_point now);
  // Fails every operation in the merge; those whose collectives were queued end once
  // the collectives have (or Close aborted them).
  void FailPending(const Status& reason);
  // Ends the ordering thread and aborts the group.
  void Close();

 private:
  using Clock = std::chrono::steady_clock;
  // (tensor id, round, phase)
  using Key = std::tuple<uint64_t, uint32_t, uint32_t>;
  struct Go {
    Key key;
    Verdict verdict = kGroup;
    ErrorKind kind = ErrorKind::kInternal;  // kFail's
    // kFail: why; kOpenGroup: the group's id; kHostForGood: why.
    std::string text;
    uint64_t sequence = 0;  // of the Go's to its worker
  };
  struct Send {
    int member;
    Go go;
  };
  // An operation of this worker in the merge.
  struct Operation {
    std::shared_ptr<Task> task;
    std::vector<PartitionTask> plan;
    std::vector<PartitionTask> led;  // the partitions this worker pushes
    size_t answered = 0;
    bool reduced = false;     // its reduce was queued: a broadcast Go follows
    bool told_ready = false;  // for its broadcast
    bool finished = false;
  };
  // At index 0: a phase of an operation, until every worker has had its Go.
  struct Waiting {
    std::string name;
    Phase phase = kReduce;
    uint32_t round = 0;
    std::vector<bool> ready;
    std::vector<bool> answered;
    std::vector<std::string> texts;  // device keys (kReduce), failures (kBroadcast)
    uint64_t signature = 0;
    int64_t bytes = 0;
    uint8_t dtype = 0;
    int first = 0;        // the worker that was ready first
    int mismatched = -1;  // a worker whose operation differs from the first one's
    int failed = -1;      // a worker whose operation failed
    bool decided = false;
    Go go;
    Clock::time_point since;
  };

  int LeaderOf(uint64_t tensor_id, uint32_t part) const;
  // Where `device` is (device_api.h); "-" and why where groups cannot be made.
  std::string DeviceKey(int device) const;
  // Tells index 0 that this worker's operation is ready for `phase`.
  void Ready(Phase phase, const Task* task, const std::string& text, bool failed = false);

  // Index 0's steps (coordinator_mutex_): worker `index` is ready; the Go's they lead
  // to are queued in `sends`, to be delivered once the lock is released.
  void Arrived(int index, const FrameHeader& header, const std::string& name,
               const std::string& text, std::vector<Send>* sends);
  bool Complete(const Waiting& waiting) const;
  void Decide(Waiting* waiting, std::vector<Send>* sends);
  // Why the collectives cannot serve the host's workers; empty if they can.
  std::string ChooseMerge(const Waiting& waiting) const;
  void Answer(int index, Waiting* waiting, std::vector<Send>* sends);
  void Forget(std::map<Key, Waiting>::iterator found);
  void Deliver(const std::vector<Send>& sends);

  // Queues `go` for the ordering thread; false if its number is taken, past or too far
  // ahead.
  bool Received(Go go);
  // The ordering thread: applies the Go's in their numbering.
  void OrderLoop();
  void Apply(const Go& go);
  std::shared_ptr<Operation> Find(const Key& key, bool take);
  Status OpenGroup(const Task& task, const std::string& id);
  // Queues the operation's grouped reduce (or broadcast) on the merge's stream.
  Status Collectives(const Operation& op, bool reduce);
  Status QueueReduce(const std::shared_ptr<Operation>& op);
  Status QueueBroadcast(const std::shared_ptr<Operation>& op);
  // The answers of the partitions this worker leads are on their way to the device.
  void Answered(const std::shared_ptr<Operation>& op);
  // The task failed (Task::set_on_failure).
  void Failed(const std::shared_ptr<Operation>& op, const Status& status);
  void Finish(const std::shared_ptr<Operation>& op, const Status& status);

  Owner* const owner_;
  const std::shared_ptr<Devices> devices_;
  const std::vector<uint32_t> members_;
  const int index_;
  const int timeout_ms_;

  std::mutex mutex_;
  // This worker's operations, by (tensor id, round, kReduce).
  std::map<Key, std::shared_ptr<Operation>> operations_;
  bool on_host_ = false;  // every operation merges on the host from now on
  // Go's by number, until the ordering thread takes them in turn.
  std::map<uint64_t, Go> gos_;
  uint64_t next_go_ = 0;
  bool closing_ = false;
  std::condition_variable go_arrived_;
  // The group's device and stream (the ordering thread's), and its handle.
  int device_ = -1;
  void* stream_ = nullptr;
  void* group_ = nullptr;  // mutex_

  // Index 0's numbering.
  std::mutex coordinator_mutex_;
  std::map<Key, Waiting> waiting_;
  std::vector<uint64_t> numbered_;  // Go's sent to each worker
  enum class Mode { kUndecided, kGroup, kHost } mode_ = Mode::kUndecided;
  std::string host_reason_;
  std::vector<std::string> group_keys_;  // the devices the group was opened on
  std::vector<bool> joined_;

  std::thread orderer_;  // last: it starts once everything above is made
};

}  // namespace bps

#endif  // TF_BPS_WORKER_DEVICE_MERGE_H_
