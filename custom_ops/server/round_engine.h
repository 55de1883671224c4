// One of the server's engine threads: the partition keys that hash to it, and the
// items the server's readers queue for them. A key always maps to the same engine,
// so its state is only ever touched by one thread and needs no lock.
//
// Each key has a Round (who is in, whether it may end: rounds/round.h), the round's
// data under its operation kind's policy (rounds/policy.h), or, when it trains
// asynchronously, an AsyncStore. The engine sends answers and reports to the server
// through Host, its only way out.
#ifndef TF_BPS_SERVER_ROUND_ENGINE_H_
#define TF_BPS_SERVER_ROUND_ENGINE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../compression/compressor.h"
#include "../rounds/async_store.h"
#include "../rounds/declarations.h"
#include "../rounds/round.h"
#include "../rounds/round_data.h"
#include "../wire/protocol.h"
#include "../wire/shared_memory.h"
#include "server_metrics.h"
#include "straggler_watch.h"

namespace bps {

// What the server's readers hand an engine.
struct EngineItem {
  enum class Kind {
    kPush,
    kFailRounds,  // fail every unfinished round (the job is failing)
    kAbandon,     // the worker gave up `round`
    kJoined,      // a worker joined: rounds waiting only for joined workers can end
    kJoinReport,  // every worker joined: report each key's last round
    kForget,      // worker `rank` said Bye: let go of its memory
  };
  Kind kind_of_item = Kind::kPush;
  uint64_t tensor_id = 0;
  uint32_t part = 0;
  uint32_t rank = 0;
  uint32_t round = 0;
  RoundSpec spec;            // the operation, as the push describes it
  int64_t rows = 0;          // gathers: the sender's first dimension
  bool host_merged = false;  // counts for every worker of the sender's host
  size_t length = 0;
  size_t wire_length = 0;        // bytes the push took on the wire (compressed pushes: fewer)
  BlockPool::Block block;        // data received over the socket, or
  const char* shared = nullptr;  // data in the worker's shared slot (same host).
  const char* data() const { return shared ? shared : block.data.get(); }
};

class RoundEngine {
 public:
  // What the engine asks of the server that runs it.
  class Host {
   public:
    virtual ~Host() = default;
    virtual void Send(uint32_t rank, const FrameHeader& header, const void* payload) = 0;
    // A result: a same-host worker gets its location in the server's shared memory.
    virtual void SendResult(uint32_t rank, const FrameHeader& header, const void* data) = 0;
    virtual bool SharesMemory(uint32_t rank) = 0;
    // The ranks of a process set (0: every worker); false if it is not registered.
    virtual bool MembersOf(uint32_t process_set, std::vector<uint32_t>* members) = 0;
    virtual const Roster& roster() = 0;
    virtual bool failing() = 0;
    virtual std::string failure() = 0;
    virtual void Fail(const std::string& reason) = 0;
    // The engine is done with a push of worker `rank` (the reader may read another).
    virtual void PushDone(uint32_t rank) = 0;
    // The engine let go of every push of worker `rank`, which said Bye.
    virtual void Forgotten(uint32_t rank) = 0;
    // Every key's latest round (for a join), by tensor id.
    virtual void ReportRounds(const std::vector<std::pair<uint64_t, uint32_t>>& rounds) = 0;
  };
  // What every engine of a server shares.
  struct Setup {
    int num_workers = 0;
    const std::vector<std::vector<uint32_t>>* host_ranks = nullptr;  // by rank
    bool enable_async = false;
    BlockPool* pool = nullptr;
    const DeclarationBook* declarations = nullptr;
    SharedSlots* results = nullptr;  // the server's shared memory for results
    // The stall inspector: a round that some workers have pushed to and others not
    // for stall_check_ms is reported to every worker (kStall) once, and failed after
    // stall_shutdown_ms; 0: never. Each engine checks its own keys between items.
    int stall_check_ms = 0;
    int stall_shutdown_ms = 0;
    // Hears who ended each round of several workers (null: nobody watches).
    StragglerWatch* stragglers = nullptr;
    // The process's figures (never null), and its entry of each worker rank (by rank):
    // the engine counts rounds, its queue and how late each push arrives.
    ServerMetrics* metrics = nullptr;
    std::vector<ServerMetrics::Rank*> ranks;
  };

  RoundEngine(Host* host, Setup setup);
  ~RoundEngine();
  void Start();
  void Enqueue(EngineItem item);
  // Ahead of everything queued (the job is failing).
  void EnqueueFirst(EngineItem item);
  // Ends the thread; items still queued are dropped (and counted out of the queue's
  // depth once the engine is destroyed, when no reader can queue more).
  void Stop();
  // Adds each tensor's traffic (bytes in, bytes out) to `by_tensor`; after Stop().
  void AddTraffic(std::map<uint64_t, std::pair<uint64_t, uint64_t>>* by_tensor) const;

 private:
  struct KeyState {
    Round round;
    RoundData data;
    AsyncStore async;
    ShmLocation result_slot;  // the round's result, if in shared memory
    bool holds_result_slot = false;
    // Compressed push_pull: the error feedback of the results this key sent, for as
    // long as the tensor keeps its compressor and partition size.
    std::unique_ptr<CompressionState> result_compression;
    const CompressionSetup* result_setup = nullptr;
    size_t result_elements = 0;
    // Tensor data pushed here and sent back, over all rounds (logged at the end).
    uint64_t bytes_in = 0;
    uint64_t bytes_out = 0;
    std::chrono::steady_clock::time_point opened_at;  // of the round in progress
    uint32_t stall_reported = 0;                     // the last round reported stalled
  };
  class KeyPort;

  void Loop();
  void Process(EngineItem item);
  // Opens the item's round; false, with the item refused, if it may not take part.
  bool Open(KeyState* key, const EngineItem& item, KeyPort* port);
  // Whether the item agrees with its round's first push (and may be merged).
  bool Agrees(KeyState* key, const EngineItem& item, KeyPort* port);
  void ProcessAsync(KeyState* key, EngineItem* item, KeyPort* port);
  // The key's result compression, made anew when the round's compressor or size changed.
  CompressionState* ResultCompression(const PartitionKey& id, KeyState* key);
  // Ends the round if every member has contributed or joined; true if it succeeded.
  bool MaybeFinish(const PartitionKey& id, KeyState* key);
  // Sends the result to every contributor; those that do not receive it get an
  // acknowledgement. Returns how many received the result.
  size_t Reply(const PartitionKey& id, const KeyState& key, const char* result, size_t length);
  void SendReply(uint32_t rank, const PartitionKey& id, uint32_t round, const void* data,
                 size_t length);
  void SendError(uint32_t rank, const PartitionKey& id, uint32_t round, ErrorKind kind,
                 const std::string& message);
  void FailRounds(const std::string& reason);
  // The stall inspector's pass over this engine's keys (Setup::stall_check_ms).
  void CheckStalls(std::chrono::steady_clock::time_point now);
  void Forget(uint32_t rank);
  void ReportRounds();

  Host* const host_;
  const Setup setup_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<EngineItem> queue_;
  bool stopping_ = false;
  std::unordered_map<PartitionKey, KeyState, PartitionKeyHash> keys_;
  std::chrono::steady_clock::time_point next_stall_check_;
  std::thread thread_;
};

}  // namespace bps

#endif  // TF_BPS_SERVER_ROUND_ENGINE_H_
