// The server: accepts workers' connections, proves they belong to the job, reads
// their frames and hands each push to the engine thread that owns its partition key
// (round_engine.h), which ends the key's rounds by their operation kind.
//
// Threads: one acceptor, one reader per worker connection, and
// BYTEPS_SERVER_ENGINE_THREAD engine threads. The server keeps what the engines
// share: who is connected, joined or gone, the declarations, the process sets.
#ifndef TF_BPS_SERVER_SERVER_H_
#define TF_BPS_SERVER_SERVER_H_

#include <atomic>
#include <chrono>
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
#include "../control/settings.h"
#include "../rounds/declarations.h"
#include "../rounds/round.h"
#include "../rounds/round_data.h"
#include "../wire/auth.h"
#include "../wire/protocol.h"
#include "../wire/transport.h"
#include "../wire/waiting_room.h"
#include "round_engine.h"
#include "server_metrics.h"

namespace bps {

// What a server is told. The table's variables (settings.def) come through From();
// the job's facts (where to listen) are the caller's.
struct ServerOptions {
  std::string host;  // the address to listen on; empty: every interface.
  int port = 0;      // 0: any free port.
  int engine_threads = 0;  // BYTEPS_SERVER_ENGINE_THREAD
  int timeout_ms = 0;      // Settings::OperationTimeout
  std::string token;       // the job's; every worker must prove it knows it (wire/auth.h)
  bool encrypt = false;    // BYTEPS_ENCRYPT: frames are sealed (wire/crypto.h)
  // BYTEPS_MAX_TENSOR_BYTES, the largest tensor a worker may declare: bounds every push
  // before it is read.
  uint64_t max_tensor_bytes = 0;
  // BYTEPS_ENABLE_ASYNC: workers may train asynchronously (OpKind::kAsyncPushPull);
  // without it their asynchronous pushes are refused, naming the variable.
  bool enable_async = false;
  // How long a connection has to say which worker it is, from its accept, however
  // slowly it trickles its bytes.
  int hello_deadline_ms = 10000;
  // The stall inspector (Horovod's HOROVOD_STALL_*): warn of a round some workers have
  // not pushed to after stall_check_ms, and fail it after stall_shutdown_ms; 0: never.
  int stall_check_ms = 0;
  int stall_shutdown_ms = 0;
  // Stragglers (straggler_watch.h): the window they are judged over (0: nobody
  // watches), and how late the last arrival must be on average to be named.
  double straggler_window_s = 0;
  double straggler_threshold_ms = 0;
  // The figures the process's Prometheus endpoint shows (server_metrics.h), which must
  // outlive the server; null: the server counts into figures of its own, unseen.
  ServerMetrics* metrics = nullptr;

  // The options the table's variables give, listening on any free port everywhere.
  static ServerOptions From(const Settings& settings);
};

class Server : private RoundEngine::Host, private Roster {
 public:
  explicit Server(ServerOptions options);
  ~Server();

  // Binds the port; workers that connect now wait in the backlog until Serve().
  Status Listen(int* bound_port);
  // Starts summing for the workers of the scheduler's address book: `host_of_rank`
  // holds each worker's host (any number naming it), so that one push merged over a
  // host's workers (kFlagHostMerged) counts for each of them. Frames of any other
  // job `generation` than the book's are refused (FrameHeader::generation).
  // `named_sources`: the addresses the book gives the workers ("local" for this host's
  // Unix socket): when the waiting room is full, a connection from one of them
  // displaces the stranger that has waited longest instead of being refused.
  Status Serve(const std::vector<int32_t>& host_of_rank, uint32_t generation = 0,
               std::vector<std::string> named_sources = {});
  // A descriptor that turns readable when the server hits a fatal failure (a worker
  // vanished), so a control loop can wait on it alongside its other sockets.
  int failure_fd() const { return failure_pipe_[0]; }
  std::string failure() override;
  // The worker whose vanishing failed the server, or -1 (the failure is another).
  int lost_worker();
  // Stops serving; with a `reason`, each worker hears it before its connection closes.
  void Stop(const std::string& reason = "");

 private:
  // A worker's connection, once it said which worker it is.
  struct WorkerConn {
    explicit WorkerConn(std::unique_ptr<Channel> c) : channel(std::move(c)) {}
    std::unique_ptr<Channel> channel;
    int rank = -1;                      // guarded by the server's conns_mutex_
    std::atomic<bool> finished{false};  // its reader has returned
    std::mutex mutex;
    std::condition_variable cv;
    int outstanding = 0;
    // After its Bye: the engines that have yet to let go of what it pushed (Forget).
    std::atomic<int> forgetting{0};
  };
  // The acceptor thread (acceptor.cc): one poll over the listeners and the waiting
  // room. A worker that proved the token gets a reader thread; a connection that has
  // not costs no thread, only its place in the room.
  void AcceptLoop();
  // Takes the connections that came into the room; false once the listener closed.
  bool AcceptNewcomers();
  // A worker that proved the token: its channel and reader, unless its rank is taken.
  void Welcome(WaitingRoom::Proven proven);
  // Joins the readers that ended. Needs conns_mutex_.
  void ReapReaders();
  void ReadLoop(std::shared_ptr<WorkerConn> conn);
  // Reads one frame of worker `rank` that is not a Bye: a declaration, a join, a
  // process set, a push or an abandon.
  Status HandleFrame(WorkerConn* worker, uint32_t rank, const FrameHeader& header,
                     DataReader* payload);
  Status ReceiveDeclaration(uint32_t rank, const FrameHeader& header, DataReader* payload);
  Status ReceiveProcessSet(const FrameHeader& header, DataReader* payload);
  // `compression`: a compressed push's setup (CheckPushLength's), null for others.
  Status ReceivePush(const FrameHeader& header, DataReader* payload,
                     const CompressionSetup* compression, EngineItem* item);
  // A push may not exceed what its sender declared the tensor to hold; a compressed
  // one must be its element count's compressed size (`*compression` is then its setup).
  Status CheckPushLength(const FrameHeader& header, uint32_t rank,
                         const CompressionSetup** compression);
  Status CheckCompressedPush(const FrameHeader& header, uint32_t rank, const Declaration* declared,
                             const CompressionSetup** compression);
  // Reads a compressed push, checks it, and hands the engine its float32 elements.
  Status DecompressPush(const FrameHeader& header, DataReader* payload,
                        const CompressionSetup* compression, EngineItem* item);
  RoundEngine& EngineOf(uint64_t tensor_id, uint32_t part);
  // Queues a control item (about worker `rank`, for kForget) on every engine.
  void EnqueueEverywhere(EngineItem::Kind kind, uint32_t rank = 0);
  void OnJoin(uint32_t rank);
  std::shared_ptr<WorkerConn> ConnOf(uint32_t rank);
  // Logs, per tensor, the data that came in and went out (DEBUG).
  void LogTraffic();
  void SetFailure(const std::string& reason, int lost_worker = -1);

  // RoundEngine::Host
  void Send(uint32_t rank, const FrameHeader& header, const void* payload) override;
  void SendResult(uint32_t rank, const FrameHeader& header, const void* data) override;
  bool SharesMemory(uint32_t rank) override;
  bool MembersOf(uint32_t process_set, std::vector<uint32_t>* members) override;
  const Roster& roster() override { return *this; }
  bool failing() override { return failed_.load(); }
  void Fail(const std::string& reason) override { SetFailure(reason); }
  void PushDone(uint32_t rank) override;
  void Forgotten(uint32_t rank) override;
  void ReportRounds(const std::vector<std::pair<uint64_t, uint32_t>>& rounds) override;

  // Roster
  bool Joined(uint32_t rank, uint16_t epoch) const override;
  bool Gone(uint32_t rank) const override;

  const ServerOptions options_;
  int num_workers_ = 0;
  std::vector<uint32_t> all_ranks_;                // 0 .. num_workers_ - 1: the global process set
  std::vector<std::vector<uint32_t>> host_ranks_;  // by rank: the workers of its host
  Listener listener_;
  int failure_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  BlockPool pool_;
  DeclarationBook declarations_;
  std::unique_ptr<StragglerWatch> stragglers_;  // the engines report to it
  std::unique_ptr<ServerMetrics> own_metrics_;  // when the options give none
  ServerMetrics* const metrics_;
  std::vector<ServerMetrics::Rank*> rank_metrics_;  // by rank, from Serve()
  std::vector<std::unique_ptr<RoundEngine>> engines_;

  mutable std::mutex conns_mutex_;
  std::vector<std::shared_ptr<WorkerConn>> conns_;  // by rank
  // Every worker's connection with its reading thread, joined once it ended.
  struct Reader {
    std::shared_ptr<WorkerConn> conn;
    std::thread thread;
  };
  std::vector<Reader> readers_;
  std::unique_ptr<WaitingRoom> room_;  // the acceptor thread's, from Serve() on
  std::vector<bool> finished_;    // rank said Bye
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

  std::mutex failure_mutex_;
  std::string failure_;
  int lost_worker_ = -1;
};

}  // namespace bps

#endif  // TF_BPS_SERVER_SERVER_H_
