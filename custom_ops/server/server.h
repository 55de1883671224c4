// The server engine: receives partition pushes from every worker and ends each
// round by its operation kind: a reduction (sum, min, max, product) into one buffer
// per partition key, the root's data for a broadcast, every worker's rows for an
// allgather. Rounds of one key never mix: a push for another round is refused.
//
// Threads: one acceptor, one reader per worker connection, and
// BYTEPS_SERVER_ENGINE_THREAD engine threads. A key always maps to the same engine
// thread, so a key's state is only ever touched by one thread and needs no lock.
#ifndef TF_BPS_SERVER_SERVER_H_
#define TF_BPS_SERVER_SERVER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../common/common.h"
#include "../wire/protocol.h"
#include "../wire/transport.h"

namespace bps {

struct ServerOptions {
  std::string host;  // the address to listen on; empty: every interface.
  int port = 0;      // 0: any free port.
  int engine_threads = 4;
  int timeout_ms = 300000;
  std::string token;  // the job's; every worker must prove it knows it (transport/auth.h)
  // The largest tensor a worker may declare: bounds every push before it is read.
  uint64_t max_tensor_bytes = uint64_t{1} << 36;
  // BYTEPS_ENABLE_ASYNC: workers may train asynchronously (OpKind::kAsyncPushPull);
  // without it their asynchronous pushes are refused, naming the variable.
  bool enable_async = false;
};

// Receive buffers, recycled so that steady-state training allocates nothing.
class BlockPool {
 public:
  struct Block {
    std::unique_ptr<char[]> data;
    size_t capacity = 0;
  };
  Block Acquire(size_t bytes);
  void Release(Block block);

 private:
  std::mutex mutex_;
  std::vector<Block> free_;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();

  // Binds the port; workers that connect now wait in the backlog until Serve().
  Status Listen(int* bound_port);
  // Starts summing for the workers of the scheduler's address book: `host_of_rank`
  // holds each worker's host (any number naming it), so that one push merged over a
  // host's workers (kFlagHostMerged) counts for each of them.
  Status Serve(const std::vector<int32_t>& host_of_rank);
  // A descriptor that turns readable when the server hits a fatal failure (a worker
  // vanished), so a control loop can wait on it alongside its other sockets.
  int failure_fd() const { return failure_pipe_[0]; }
  std::string failure();
  // Stops serving; with a `reason`, each worker hears it before its connection closes.
  void Stop(const std::string& reason = "");

 private:
  struct WorkerConn;
  struct PushItem {
    enum class Kind {
      kPush,
      kFailRounds,  // fail every unfinished round (a worker died)
      kAbandon,     // the worker gave up `round`
      kJoined,      // a worker joined: rounds waiting only for joined workers can end
      kJoinReport,  // every worker joined: report each key's last round, then release them
      kForget,      // worker `rank` said Bye: let go of its memory (Forget)
    };
    Kind kind_of_item = Kind::kPush;
    uint64_t tensor_id = 0;
    uint32_t part = 0;
    uint32_t rank = 0;
    uint32_t round = 0;
    OpKind kind = OpKind::kPushPull;
    uint8_t dtype = 0;
    ReduceOp reduce_op = ReduceOp::kSum;
    uint64_t signature = 0;
    int64_t rows = 0;          // gathers: the sender's first dimension
    int32_t owner = -1;        // the one rank the result goes to; -1: every worker
    uint32_t process_set = 0;  // the workers taking part; 0: all
    bool host_merged = false;  // counts for every worker of the sender's host
    size_t length = 0;
    BlockPool::Block block;        // data received over the socket, or
    const char* shared = nullptr;  // data in the worker's shared slot (same host).
    const char* data() const { return shared ? shared : block.data.get(); }
  };
  // One worker's data in a round whose result is not a reduction (broadcast, allgather).
  struct Contribution {
    BlockPool::Block block;
    const char* shared = nullptr;
    size_t length = 0;
    int64_t rows = 0;
    const char* data() const { return shared ? shared : block.data.get(); }
  };
  // One partition key: the round in progress, and the last one that ended.
  struct KeyState {
    bool active = false;
    uint32_t round = 0;        // in progress, while active
    uint32_t last_closed = 0;  // rounds up to this one are over: their pushes are stale
    std::string closed_error;  // why `last_closed` failed; empty if it completed
    ErrorKind closed_kind = ErrorKind::kOk;
    OpKind kind = OpKind::kPushPull;
    uint8_t dtype = 0;
    ReduceOp reduce_op = ReduceOp::kSum;
    uint64_t signature = 0;
    int32_t owner = -1;
    uint32_t process_set = 0;
    std::vector<uint32_t> members;       // the ranks taking part, ascending
    size_t length = 0;                   // reductions: every push's length
    BlockPool::Block sum;                // push_pull: running result of socket pushes
    std::vector<const char*> shared;     // push_pull: shared-slot pushes, reduced at the end
    std::vector<Contribution> by_rank;   // broadcast and allgather
    std::vector<uint32_t> contributors;  // who pushed: they receive the result
    std::vector<uint32_t> covered;       // whose data is in: contributors and their hosts'
    ShmLocation result_slot;             // the round's result, if in shared memory
    bool holds_result_slot = false;
    // Tensor data pushed here and sent back, over all rounds (logged at the end).
    uint64_t bytes_in = 0;
    uint64_t bytes_out = 0;
    // Asynchronous training: the key holds parameters instead of rounds. They exist
    // once rank 0's first push arrived; until then other workers' first pushes wait
    // in `awaiting_parameters` (rank, round). Each rank's rounds only ever grow.
    bool asynchronous = false;
    BlockPool::Block parameters;
    std::vector<std::pair<uint32_t, uint32_t>> awaiting_parameters;
    std::vector<uint32_t> async_rounds;  // by rank: the last round it pushed
  };
  struct Engine {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<PushItem> queue;
    std::unordered_map<PartitionKey, KeyState, PartitionKeyHash> keys;
    std::thread thread;
  };

  void AcceptLoop();
  // Joins the readers that ended and forgets connections no worker holds; true if
  // another connection may wait for its introduction. Needs conns_mutex_.
  bool ReapReaders();
  void ReadLoop(std::shared_ptr<WorkerConn> conn);
  void EngineLoop(Engine* engine);
  void Enqueue(PushItem item);
  // Queues a control item (no data; about worker `rank`, for kForget) on every engine.
  void EnqueueEverywhere(PushItem::Kind kind, uint32_t rank = 0);
  void OnJoin(uint32_t rank);
  // Ends the round if every member has contributed or joined; true if it ended.
  bool MaybeComplete(const PartitionKey& id, KeyState* key);
  void ReportRounds(Engine* engine);
  Status ReceiveProcessSet(const FrameHeader& header, DataReader* payload);
  // The ranks of a process set (0: every worker); false if it is not registered.
  bool MembersOf(uint32_t process_set, std::vector<uint32_t>* members);
  void Process(Engine* engine, PushItem item);
  void Abandon(const PartitionKey& id, KeyState* key, const PushItem& item);
  // Worker `rank` said Bye: ends the rounds on this engine that still hold its push;
  // the last engine to pass this point unmaps the memory it shared with us.
  void Forget(Engine* engine, uint32_t rank);
  // An asynchronous push (OpKind::kAsyncPushPull): stores or adds it and answers its
  // sender with the parameters; nothing waits for other workers but the first round.
  void ProcessAsync(const PartitionKey& id, KeyState* key, PushItem* item);
  // Adds the item to its round (a reduction, or kept by rank).
  void Accumulate(KeyState* key, PushItem* item);
  // The round's result, in one buffer; in the listener's shared slots when a
  // same-host worker receives it, so that it reads it without a copy over a socket.
  const char* Complete(const PartitionKey& id, KeyState* key, size_t* length);
  // Sends the result to every contributor; broadcast receivers get the root's data.
  // Returns how many received the result (the others an acknowledgement).
  size_t Reply(const PartitionKey& id, const KeyState& key, const char* result, size_t length);
  // Logs, per tensor, the data that came in and went out (DEBUG).
  void LogTraffic();
  // Ends the round in progress with an error for each contributor (and for the
  // `refused` push's worker, when its push is refused with the round).
  void FailRound(const PartitionKey& id, KeyState* key, ErrorKind kind, const std::string& message,
                 const PushItem* refused = nullptr);
  void CloseRound(KeyState* key);
  // Null, with the job failing, when shared memory runs out.
  // The slot is held for the round (KeyState::result_slot).
  char* ResultSlot(const PartitionKey& id, KeyState* key, size_t length);
  Status ReceivePush(const FrameHeader& header, DataReader* payload, PushItem* item);
  // A push may not exceed what its sender declared the tensor to hold.
  Status CheckPushLength(const FrameHeader& header, uint32_t rank);
  std::shared_ptr<WorkerConn> ConnOf(uint32_t rank);
  void SendToWorker(uint32_t rank, const FrameHeader& header, const void* payload);
  void SendError(uint32_t rank, const PartitionKey& id, uint32_t round, ErrorKind kind,
                 const std::string& message);
  void SendReply(uint32_t rank, const PartitionKey& id, uint32_t round, const void* data,
                 size_t length);
  std::string Describe(uint64_t tensor_id, uint32_t rank);
  std::string MismatchMessage(uint64_t tensor_id, uint32_t rank_a, uint32_t rank_b);
  void SetFailure(const std::string& reason);
  void FailRounds(Engine* engine, const std::string& reason);

  const ServerOptions options_;
  int num_workers_ = 0;
  std::vector<uint32_t> all_ranks_;                // 0 .. num_workers_ - 1: the global process set
  std::vector<std::vector<uint32_t>> host_ranks_;  // by rank: the workers of its host
  Listener listener_;
  int failure_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  BlockPool pool_;
  std::vector<std::unique_ptr<Engine>> engines_;

  std::mutex conns_mutex_;
  std::vector<std::shared_ptr<WorkerConn>> conns_;  // by rank
  // Every open connection with its reading thread; a connection dropped before it
  // became a worker's is reaped at the next accept, releasing its descriptor.
  struct Reader {
    std::shared_ptr<WorkerConn> conn;
    std::thread thread;
  };
  std::vector<Reader> readers_;
  std::vector<bool> finished_;  // rank said Bye
  // Lets the per-push path skip the locked checks while every worker is alive and busy.
  std::atomic<int> finished_count_{0};
  std::atomic<bool> failed_{false};

  // join(): who has joined (guarded by conns_mutex_), and the rounds the engines
  // report once everyone has, for the workers to catch up on.
  std::vector<bool> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  std::atomic<int> joined_any_{0};
  std::mutex join_report_mutex_;
  int join_reports_pending_ = 0;
  std::vector<std::pair<uint64_t, uint32_t>> join_rounds_;

  std::mutex process_sets_mutex_;
  std::unordered_map<uint32_t, std::vector<uint32_t>> process_sets_;

  std::mutex declarations_mutex_;
  std::map<std::pair<uint64_t, uint32_t>, Declaration> declarations_;

  std::mutex failure_mutex_;
  std::string failure_;
};

}  // namespace bps

#endif  // TF_BPS_SERVER_SERVER_H_
