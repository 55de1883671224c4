// One collective operation on one tensor, from the adapter's request until its
// completion callback: the unit every stage of the worker passes along.
#ifndef TF_BPS_WORKER_TASK_H_
#define TF_BPS_WORKER_TASK_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../common/common.h"
#include "../compression/registry.h"
#include "../wire/protocol.h"

namespace bps {

class DeviceStaging;

// Where a task's input and output live: host memory, or the memory of device
// `device` (an ordinal of the loaded device table, device.h), where the caller queued
// the work that writes the input on `stream`.
struct MemoryPlace {
  int device = -1;
  void* stream = nullptr;
  bool on_device() const { return device >= 0; }
};

// What an adapter asks for. `input` must stay valid and unchanged, and `output`
// writable, until the task completes; they may alias (the op then works in place).
// Where the output's size depends on other workers (allgather, alltoall) or on the
// rank (reducescatter), `output` is null and the task asks the adapter for it
// through AllocateFn once the size is known.
struct TaskSpec {
  Declaration op;  // name, kind, dtype, shape, reduce op, root, scale factors
  const void* input = nullptr;
  void* output = nullptr;
  size_t bytes = 0;  // of the input
  // Alltoall: rows of the input for each receiving rank (empty: an even split).
  std::vector<int64_t> splits;
  MemoryPlace place;
};

// The workers taking part in a task (a process set), and this worker's place among them.
struct Group {
  std::vector<int32_t> ranks;  // ascending
  int index = 0;               // of this worker in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
  bool Contains(int rank) const;
};

// The adapter's mistakes (shape and bytes disagree, a root outside the group, ...),
// caught before anything reaches the wire.
Status CheckTaskSpec(const TaskSpec& spec, const Group& group);

// A push_pull that asks for compression travels as kCompressedPushPull (with the
// compressor's canonical text) when it has at least `min_compress_bytes`, else as a
// plain push_pull (BytePS's BYTEPS_MIN_COMPRESS_BYTES). After CheckTaskSpec.
void ChooseWireKind(size_t min_compress_bytes, Declaration* op);

// The rows of a `rows`-row tensor that rank `rank` of `size` keeps in a
// reducescatter: an even split, the first ranks taking one more when it is uneven.
int64_t ScatterRows(int64_t rows, int rank, int size);

// How a push_pull or a broadcast of `bytes` bytes (elements of `element` bytes) is cut:
// the size of every partition but the last, whole elements, at most `limit`
// (BYTEPS_PARTITION_BYTES). The count is rounded up to a multiple of `spread` (the
// length of the servers' cycle, ServerCycle) as long as partitions keep
// kMinSpreadBytes, so that a mid-sized tensor keeps every server busy and a large one
// gives each server its share exactly.
// With `across_hosts` (the job spans machines), partitions are at most
// kNetworkPartitionBytes. Over a network, small pieces keep links busy while the
// first sums travel back and the last pushes travel out, where on one host larger
// pieces cost fewer messages; where CPUs, not links, are the limit, small pieces cost
// no time (examples/benchmarks/network_bound.py compares piece sizes).
constexpr size_t kMinSpreadBytes = 64 * 1024;
constexpr size_t kNetworkPartitionBytes = 128 * 1024;
size_t EvenPartitionBytes(size_t bytes, size_t element, size_t limit, size_t spread,
                          bool across_hosts = false);
int64_t ScatterFirstRow(int64_t rows, int rank, int size);

// The order in which a tensor's partitions visit the servers: one cycle in which
// server i appears shares[i] times, interleaved (smooth weighted round robin), so
// that consecutive partitions go to different servers. Partition p of a tensor goes
// to cycle[(first + p) % cycle.size()]. No shares: every server once, in order.
// Shares are uneven in the BytePS paper's hybrid layout (see tf_bps/runtime/server_shares.py).
std::vector<int> ServerCycle(const std::vector<uint32_t>& shares, size_t num_servers);

// Output 0 is the result; an alltoall's output 1 receives its splits (int64, one
// per sending rank). Returns the buffer for `shape`, or null with `status` set.
using AllocateFn =
    std::function<void*(int index, const std::vector<int64_t>& shape, Status* status)>;
using DoneFn = std::function<void(const Status&)>;

class Task {
 public:
  // `order`: the tensor's declaration order, its priority (earlier goes first).
  Task(TaskSpec spec, Group group, uint64_t tensor_id, uint64_t order, uint32_t round,
       int timeout_ms, AllocateFn allocate, DoneFn done);

  const TaskSpec& spec() const { return spec_; }
  const Declaration& op() const { return spec_.op; }
  const Group& group() const { return group_; }
  const std::string& name() const { return spec_.op.name; }
  OpKind kind() const { return spec_.op.kind; }
  DataType dtype() const { return spec_.op.dtype; }
  uint64_t tensor_id() const { return tensor_id_; }
  uint64_t order() const { return order_; }
  uint64_t signature() const { return signature_; }
  // kCompressedPushPull: the compressor (null for other kinds).
  const CompressionSetup* compression() const { return compression_; }
  // The operation as a kDeclare payload, and its hash: a peer hears the declaration
  // again whenever the hash differs from the one it last heard for the tensor.
  const std::string& declaration_frame() const { return declaration_frame_; }
  uint64_t declaration_hash() const { return declaration_hash_; }
  const std::vector<int64_t>& splits() const { return spec_.splits; }
  uint32_t round() const { return round_; }
  int timeout_seconds() const { return timeout_ms_ / 1000; }
  bool expired(std::chrono::steady_clock::time_point now) const { return now >= deadline_; }

  // Where the output lives; null until AllocateOutput where the spec had none.
  void* output() const { return output_; }
  Status AllocateOutput(const std::vector<int64_t>& shape);
  // An alltoall's second output: the rows each rank sent here.
  Status SetReceivedSplits(const std::vector<int64_t>& splits);
  // Where the pushes read from: the input, or a scaled copy of it.
  const char* source() const { return source_; }
  void set_source(const char* source) { source_ = source; }
  // Working memory that lives as long as the task (a prescaled copy of the input).
  std::vector<char>& scratch() { return scratch_; }

  // I/O on the tensor's memory is bracketed so that a failure never completes the
  // task (and lets the framework free the memory) while a thread still touches it.
  bool BeginIo();
  void EndIo();
  // Whether the task failed (it completes once no I/O bracket is open).
  bool failed();
  // The task is planned: it completes once `partitions` are done (at once if none).
  void Launch(int partitions);
  // More partitions to wait for (a gather's rows, once their sizes are known).
  void AddPartitions(int count);
  void PartitionDone();
  void Fail(const Status& status);
  // Called once, on the thread that fails the task first, before it completes.
  void set_on_failure(std::function<void(const Status&)> observer);
  // Partitions whose answer arrived (the push window counts them, Worker::push_window).
  void CountAnswer() { answered_.fetch_add(1, std::memory_order_relaxed); }
  uint32_t answered() const { return answered_.load(std::memory_order_relaxed); }
  // The timeline recording that took this task (timeline.h); 0: not traced. Set before
  // the task reaches any stage, read without a lock afterwards.
  uint32_t trace_session() const { return trace_session_; }
  void set_trace_session(uint32_t session) { trace_session_ = session; }
  // The learning rate of the step this task belongs to (0: not told); set before the
  // task reaches any stage. Error feedback rescales its residual when it changes.
  double learning_rate() const { return learning_rate_; }
  void set_learning_rate(double rate) { learning_rate_ = rate; }
  // A task on device memory: where its pinned buffers meet the device
  // (device_staging.h); null on the host. Set before the task reaches any stage.
  DeviceStaging* staging() const { return staging_.get(); }
  void set_staging(std::shared_ptr<DeviceStaging> staging) { staging_ = std::move(staging); }

 private:
  void MaybeFinishLocked(std::unique_lock<std::mutex>& lock);

  const TaskSpec spec_;
  const Group group_;
  const uint64_t tensor_id_;
  const uint64_t order_;
  const uint32_t round_;
  const uint64_t signature_;
  const std::string declaration_frame_;
  std::atomic<uint32_t> answered_{0};
  const uint64_t declaration_hash_;
  const int timeout_ms_;
  const std::chrono::steady_clock::time_point deadline_;
  uint32_t trace_session_ = 0;
  double learning_rate_ = 0;
  std::shared_ptr<DeviceStaging> staging_;
  const CompressionSetup* compression_ = nullptr;
  AllocateFn allocate_;
  void* output_;
  const char* source_;
  std::vector<char> scratch_;
  std::mutex mutex_;
  int remaining_ = 0;
  bool launched_ = false;
  int active_io_ = 0;
  bool failed_ = false;
  bool done_called_ = false;
  Status error_ = Status::OK();
  std::function<void(const Status&)> on_failure_;
  DoneFn done_;
};

// The unit of work in the push stages: one partition of one task bound for one server
// (or for the worker of this host that merges it, see local_merge.h).
struct PartitionTask {
  std::shared_ptr<Task> task;
  uint32_t part = 0;
  size_t offset = 0;           // of the partition in the tensor (input and output alike).
  const char* data = nullptr;  // what to push: `push_length` bytes (none for broadcast receivers).
  size_t push_length = 0;
  size_t reply_length = 0;  // bytes the server returns; allgather: known only then.
  uint64_t priority = 0;    // lower goes first: declaration order, then partition index.
  int32_t owner = -1;       // the one rank receiving the result (alltoall, reducescatter)
  uint64_t signature = 0;
  uint8_t flags = 0;        // FrameFlags
  uint16_t join_epoch = 0;  // local merges: the joins the sender had seen complete
  int64_t queued_at = 0;    // when it entered its push stage, if the timeline traces it
};

// Partition `part` of `task`: `push_length` bytes at `data` to push, `reply_length` to
// receive at `offset` in the output; ranked by the tensor's order, then the index.
PartitionTask MakePartition(const std::shared_ptr<Task>& task, uint32_t part, size_t offset,
                            const char* data, size_t push_length, size_t reply_length);

struct PartitionTaskOrder {
  bool operator()(const PartitionTask& a, const PartitionTask& b) const {
    return a.priority > b.priority;
  }
};

}  // namespace bps

#endif  // TF_BPS_WORKER_TASK_H_
