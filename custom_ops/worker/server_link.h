// The worker's connection to one server (see worker.h for the stages around it).
#ifndef TF_BPS_WORKER_SERVER_LINK_H_
#define TF_BPS_WORKER_SERVER_LINK_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../common/common.h"
#include "../compression/compressor.h"
#include "../compression/registry.h"
#include "../wire/transport.h"
#include "credits.h"
#include "pending.h"
#include "stage.h"
#include "stats.h"
#include "task.h"
#include "timeline.h"

namespace bps {

// A worker's connection to one server, with its push stage (a thread that sends
// partitions in priority order, within the scheduling credit and the push window) and
// its pull stage (a thread that receives each answer straight into the output).
class ServerLink {
 public:
  // What a link reports to, and asks of, the worker that owns it: its only way up.
  class Owner {
   public:
    virtual ~Owner() = default;
    virtual bool stopping() const = 0;
    // The worker's timeline: never null, recording or not (timeline.h).
    virtual Timeline* timeline() const = 0;
    // Where the link counts the bytes it moves: never null.
    virtual WorkerStats* stats() const = 0;
    // The link broke, or its server said why it stops: the worker fails with `reason`.
    virtual void OnLinkFailure(const std::string& reason) = 0;
    // Server `server` went away without a word: it is probably dead. True: the worker
    // keeps the link's partitions until the job decides where they go (an elastic
    // job, Worker::MoveLostServer), and the link reports nothing more; false: the
    // link fails (OnLinkFailure follows).
    virtual bool OnServerLost(int server) = 0;
    // A partition was answered: links waiting on the push window may go on.
    virtual void OnAnswer() = 0;
    // A gather's sizes arrived (`sizes`: every worker's rows, then an alltoall's split
    // matrix): allocate the output and send this worker's rows.
    virtual Status StartGatherData(const std::shared_ptr<Task>& task,
                                   const std::vector<char>& sizes) = 0;
    // The server answered a join: the last rank to join and each tensor's last round.
    virtual void OnJoined(int server, int last_rank,
                          const std::unordered_map<uint64_t, uint32_t>& rounds) = 0;
    // The server's stall inspector warns of a tensor some workers have not pushed.
    virtual void OnStall(uint64_t tensor_id, const std::string& warning) = 0;
  };

  // Link `index` of worker `rank`. `credit_bytes`: BYTEPS_SCHEDULING_CREDIT for this
  // server (credits.h); `push_window`: see Worker::push_window.
  ServerLink(Owner* owner, int rank, int index, ServerAddress address,
             std::unique_ptr<Channel> channel, size_t credit_bytes, uint32_t push_window);
  ~ServerLink();

  void Start();
  // False, with `task` left as it was, once the link is retired: the worker's routes
  // already name another server for it.
  bool Enqueue(PartitionTask& task);
  // The server is gone from the job: the link sends and reports nothing more, and
  // hands back every partition that waited for an answer here or to be sent.
  std::vector<PendingPartition> Retire();
  // Looks at the waiting partitions again: the push window moved.
  void Recheck() { push_stage_.Recheck(); }
  // Registers (or, with no ranks, removes) a process set at this server.
  void SendProcessSet(uint32_t id, const std::vector<int32_t>& ranks);
  // Tells the server this worker has joined (bps.join).
  void SendJoin();
  // Forgets `task`'s partitions still waiting here and tells the server this worker
  // gave up their round, so no other worker's contribution waits for it in vain.
  // The tensor's next pushes get fresh shared memory: a peer may still be reading.
  void Abandon(uint64_t tensor_id, uint32_t round, OpKind kind);
  // Tells the server this worker gives up `part` of the round without having pushed
  // it, so that the other workers' contributions do not wait for it.
  void AbandonUnsent(uint64_t tensor_id, uint32_t round, uint32_t part, OpKind kind);
  // Sends Bye and closes; pending partitions are failed by the caller.
  void Close(int rank);
  void Join();
  // Fails every partition still waiting for its sum here.
  void FailPending(const Status& reason);
  void FailExpired(std::chrono::steady_clock::time_point now);
  std::string description() const;

 private:
  // The timeline if one of its recordings took `task`, else null.
  Timeline* TracerFor(const Task& task) const;

  // The push stage's admission: whether the scheduling credit lets `partition` go.
  bool Admit(const PartitionTask& partition);
  // Gives back the credit of partitions that left pending_.
  void ReturnCredit(const PendingPartition& pending);
  void SendAbandons(uint64_t tensor_id, uint32_t round, OpKind kind,
                    const std::vector<uint32_t>& parts);
  // The push stage's work: one partition to the server. False once the link broke.
  bool Push(PartitionTask& partition);
  // When the partition's push ended (or began), for its PULL stage on the timeline.
  void MarkSent(const PartitionTask& partition, int64_t at);
  // Sends `length` bytes at `data` as the partition's push (its declaration first).
  Status SendPartition(const PartitionTask& task, const char* data, size_t length,
                       FrameHeader* header);
  // A compressed push_pull's partition in compressed form, in compressed_; sets the
  // header's element count.
  void CompressPartition(const PartitionTask& partition, FrameHeader* header);
  void ReceiveLoop();
  Status HandleReply(const FrameHeader& header, DataReader* payload);
  Status HandleJoined(const FrameHeader& header, DataReader* payload);
  // The pending partition this frame answers; false for a stale or unknown round.
  bool TakePending(const FrameHeader& header, PendingPartition* pending);
  // A gather's sizes arrived: its rows can move.
  Status StartGather(const FrameHeader& header, DataReader* payload,
                     const PendingPartition& pending);
  // Average and postscale on one received partition.
  void FinishPartition(const Task& task, void* data, size_t bytes);

  Owner* const owner_;
  const int rank_;
  const int index_;
  const uint32_t push_window_;
  const ServerAddress address_;
  std::unique_ptr<Channel> channel_;

  Stage<PartitionTask, PartitionTaskOrder> push_stage_{"push"};
  PushCredits credits_;
  // The declaration hash this server last heard per tensor; push stage only.
  std::unordered_map<uint64_t, uint64_t> declared_;
  // Compressed push_pull, push stage only: each partition's momentum and error
  // feedback (made anew when its compressor or size changes), and the bytes of the
  // push being sent.
  struct PushCompression {
    const CompressionSetup* setup = nullptr;
    size_t elements = 0;
    double learning_rate = 0;  // of the step it last compressed (0: not told)
    std::unique_ptr<CompressionState> state;
  };
  std::unordered_map<PartitionKey, PushCompression, PartitionKeyHash> push_compression_;
  std::vector<char> compressed_;

  PendingTable pending_;

  // Retire() was called; OnServerLost said the worker keeps the partitions.
  std::atomic<bool> retired_{false};
  std::atomic<bool> held_{false};

  std::thread receiver_;
  std::mutex receiver_mutex_;
  std::condition_variable receiver_cv_;
  bool receiver_done_ = false;
};

}  // namespace bps

#endif  // TF_BPS_WORKER_SERVER_LINK_H_
