// The worker side of the core: turns push_pull calls into partition pushes to the
// summation servers and pulls the sums straight back into the output tensor.
//
// Stages (each its own thread, so partitions of one tensor and of many tensors overlap):
//   caller thread  declare (name -> id, once) and partition, enqueue per server
//   push stage     one sender thread per server link, highest priority first
//   pull stage     one receiver thread per server link, writes into the output
//   watchdog       fails operations that outlive the operation timeout
#ifndef TF_BPS_CORE_WORKER_H_
#define TF_BPS_CORE_WORKER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "shared_memory.h"
#include "transport.h"

namespace bps {

struct ServerAddress {
  std::string host;
  int port;
  bool same_host = false;  // Try the server's local Unix socket before TCP.
};

struct WorkerOptions {
  int rank = 0;
  int size = 1;
  std::vector<ServerAddress> servers;
  size_t partition_bytes = 4096000;
  int timeout_ms = 300000;
};

// One push_pull of one tensor while it is in flight.
class PushPullOp {
 public:
  PushPullOp(std::string name, uint64_t tensor_id, TensorView view, ReduceOp op, int divisor,
             int partitions, int timeout_ms, DoneCallback done);

  const std::string& name() const { return name_; }
  uint64_t tensor_id() const { return tensor_id_; }
  const TensorView& view() const { return view_; }
  ReduceOp reduce_op() const { return op_; }
  int divisor() const { return divisor_; }
  bool expired(std::chrono::steady_clock::time_point now) const { return now >= deadline_; }
  int timeout_seconds() const { return timeout_ms_ / 1000; }

  // I/O on the tensor's memory is bracketed so that a failure never completes the
  // op (and lets the framework free the memory) while a thread still touches it.
  bool BeginIo();
  void EndIo();
  void PartitionDone();
  void Fail(const Status& status);

 private:
  void MaybeFinishLocked(std::unique_lock<std::mutex>& lock);

  const std::string name_;
  const uint64_t tensor_id_;
  const TensorView view_;
  const ReduceOp op_;
  const int divisor_;
  const int timeout_ms_;
  const std::chrono::steady_clock::time_point deadline_;
  std::mutex mutex_;
  int remaining_;
  int active_io_ = 0;
  bool failed_ = false;
  bool done_called_ = false;
  Status error_ = Status::OK();
  DoneCallback done_;
};

// The unit of work in the push stage: one partition of one op bound for one server.
struct PartitionTask {
  std::shared_ptr<PushPullOp> op;
  uint32_t part;
  size_t offset;
  size_t length;
  uint64_t priority;          // lower goes first: declaration order, then partition index.
  uint64_t signature;
  std::string declare_frame;  // non-empty: describe the tensor to the server first.
};

struct PartitionTaskOrder {
  bool operator()(const PartitionTask& a, const PartitionTask& b) const {
    return a.priority > b.priority;
  }
};

class Worker;

// The connection to one server with its push (sender) and pull (receiver) threads.
class ServerLink {
 public:
  // `shared_memory`: the server is on this host (a Unix socket), so partition data
  // goes through shared slots instead of the socket.
  ServerLink(Worker* worker, int index, ServerAddress address, std::unique_ptr<Connection> conn,
             bool shared_memory);
  ~ServerLink();

  void Start();
  void Enqueue(PartitionTask task);
  // Sends Bye and closes; pending partitions are failed by the caller.
  void Close(int rank);
  void Join();
  // Fails every partition still waiting for its sum here.
  void FailPending(const std::string& reason);
  void FailExpired(std::chrono::steady_clock::time_point now);
  std::string description() const;

 private:
  struct Pending {
    std::shared_ptr<PushPullOp> op;
    uint32_t part;
    size_t offset;
    size_t length;
  };

  void SendLoop();
  Status SendPartition(const PartitionTask& task, FrameHeader* header);
  void ReceiveLoop();
  Status HandleReply(const FrameHeader& header);
  Status HandleArena();
  std::shared_ptr<PushPullOp> TakePending(const FrameHeader& header, Pending* pending);

  Worker* const worker_;
  const int index_;
  const ServerAddress address_;
  std::unique_ptr<Connection> conn_;
  const bool shared_memory_;
  // Push slots, one per partition key; only the sender thread touches them.
  SlotAllocator slot_allocator_;
  std::unordered_map<PartitionKey, ShmLocation, PartitionKeyHash> slots_;
  // The server's arenas holding sums; only the receiver thread touches them.
  PeerArenas server_arenas_;

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::priority_queue<PartitionTask, std::vector<PartitionTask>, PartitionTaskOrder> queue_;
  bool closing_ = false;

  std::mutex pending_mutex_;
  std::unordered_map<PartitionKey, Pending, PartitionKeyHash> pending_;

  std::thread sender_;
  std::thread receiver_;
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();

  Status Start();
  // Asynchronous: `done` runs on a core thread once the output holds the result.
  void PushPull(const TensorView& view, const std::string& name, ReduceOp op, DoneCallback done);
  // Fails every in-flight and future operation with `reason` (a peer died, say).
  void Abort(const std::string& reason);
  void Stop();
  // Why the worker can no longer push_pull; OK while it is healthy.
  Status fatal_error();

  const WorkerOptions& options() const { return options_; }
  bool stopping() const { return stopping_.load(); }
  // Called by a link whose server vanished.
  void OnLinkFailure(const std::string& reason);
  void OnOpFinished(const std::string& name);

 private:
  struct TensorEntry {
    uint64_t id;
    uint64_t order;
    uint64_t signature = 0;
    bool in_flight = false;
  };

  void WatchdogLoop();

  const WorkerOptions options_;
  std::vector<std::unique_ptr<ServerLink>> links_;

  std::mutex registry_mutex_;
  std::unordered_map<std::string, TensorEntry> registry_;

  std::mutex fatal_mutex_;
  std::string fatal_reason_;

  std::atomic<bool> stopping_{false};
  std::mutex watchdog_mutex_;
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;
};

}  // namespace bps

#endif  // TF_BPS_CORE_WORKER_H_
