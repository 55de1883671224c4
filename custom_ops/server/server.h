// The summation server: receives partition pushes from every worker, sums them in
// one buffer per partition key, and sends the sum back to every worker.
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

#include "../core/common.h"
#include "../core/shared_memory.h"
#include "../core/transport.h"

namespace bps {

struct ServerOptions {
  int port = 0;  // 0: any free port.
  int engine_threads = 4;
  int timeout_ms = 300000;
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
  // Starts summing for `num_workers` workers, learnt from the scheduler's address book.
  Status Serve(int num_workers);
  // A descriptor that turns readable when the server hits a fatal failure (a worker
  // vanished), so a control loop can wait on it alongside its other sockets.
  int failure_fd() const { return failure_pipe_[0]; }
  std::string failure();
  void Stop();

 private:
  struct WorkerConn;
  struct PushItem {
    bool fail_rounds = false;  // Not a push: fail every unfinished round (a worker died).
    uint64_t tensor_id = 0;
    uint32_t part = 0;
    uint32_t rank = 0;
    uint8_t dtype = 0;
    uint64_t signature = 0;
    size_t length = 0;
    BlockPool::Block block;    // data received over the socket, or
    const char* shared = nullptr;  // data in the worker's shared slot (same host).
  };
  struct KeyState {
    BlockPool::Block sum;  // running sum of the pushes that came over sockets
    std::vector<const char*> shared;  // pushes in shared slots, summed when all are in
    size_t length = 0;
    uint64_t signature = 0;
    uint8_t dtype = 0;
    std::vector<uint32_t> contributors;
    std::string error;
  };
  struct Engine {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<PushItem> queue;
    std::unordered_map<PartitionKey, KeyState, PartitionKeyHash> keys;
    // Where each key's sum goes for same-host workers; kept across rounds, since a
    // key is only summed again once every worker has pushed it again, and so has
    // finished reading the last sum.
    std::unordered_map<PartitionKey, ShmLocation, PartitionKeyHash> result_slots;
    std::thread thread;
  };

  void AcceptLoop();
  void ReadLoop(std::shared_ptr<WorkerConn> conn);
  void EngineLoop(Engine* engine);
  void Process(Engine* engine, PushItem item);
  // Adds the round's pushes into one buffer; returns it (and its slot, when shared).
  const char* Complete(Engine* engine, const PartitionKey& id, KeyState* key,
                       ShmLocation* slot);
  Status ReceivePush(WorkerConn* worker, const FrameHeader& header, PushItem* item);
  void SendToWorker(uint32_t rank, FrameType type, uint64_t tensor_id, uint32_t part,
                    const void* payload, size_t length);
  void SendError(uint32_t rank, uint64_t tensor_id, uint32_t part, const std::string& message);
  void SendReply(uint32_t rank, uint64_t tensor_id, uint32_t part, const void* data, size_t length,
                 const ShmLocation* slot);
  std::string Describe(uint64_t tensor_id, uint32_t rank);
  std::string MismatchMessage(uint64_t tensor_id, uint32_t rank_a, uint32_t rank_b);
  void SetFailure(const std::string& reason);
  void FailRounds(Engine* engine, const std::string& reason);

  const ServerOptions options_;
  int num_workers_ = 0;
  int listen_fd_ = -1;
  int local_listen_fd_ = -1;  // Unix socket for workers on this host.
  int failure_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  BlockPool pool_;
  std::vector<std::unique_ptr<Engine>> engines_;

  std::mutex results_mutex_;
  SlotAllocator results_;  // sums for same-host workers

  std::mutex conns_mutex_;
  std::vector<std::shared_ptr<WorkerConn>> conns_;  // by rank
  std::vector<std::shared_ptr<WorkerConn>> accepted_;  // every connection, for Stop()
  std::vector<std::thread> readers_;
  std::vector<bool> finished_;  // rank said Bye
  // Lets the per-push path skip the locked checks while every worker is alive and busy.
  std::atomic<int> finished_count_{0};
  std::atomic<bool> failed_{false};

  std::mutex declarations_mutex_;
  std::map<std::pair<uint64_t, uint32_t>, Declaration> declarations_;

  std::mutex failure_mutex_;
  std::string failure_;
};

}  // namespace bps

#endif  // TF_BPS_SERVER_SERVER_H_
