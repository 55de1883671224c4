#include "task.h"

#include <algorithm>
#include <cstring>

#include "../common/reduce.h"
#include "../compression/registry.h"
#include "op_policy.h"

namespace bps {

// The adapter's mistakes, caught before anything reaches the wire.
bool Group::Contains(int rank) const {
  return std::binary_search(ranks.begin(), ranks.end(), rank);
}

Status CheckTaskSpec(const TaskSpec& spec, const Group& group) {
  const Declaration& op = spec.op;
  auto invalid = [&](const std::string& why) { return InvalidRequest(op, why); };
  size_t bytes = DataTypeSize(op.dtype);
  for (int64_t dim : op.shape) {
    if (dim < 0) return invalid("negative dimension in " + ShapeString(op.dtype, op.shape));
    bytes *= static_cast<size_t>(dim);
  }
  if (bytes != spec.bytes)
    return invalid(std::to_string(spec.bytes) + " bytes do not make " +
                   ShapeString(op.dtype, op.shape));
  if (IsReduction(op.kind) && !CanReduce(op.dtype))
    return invalid(std::string(DataTypeName(op.dtype)) + " tensors cannot be reduced");
  if (!IsReduction(op.kind) && (op.prescale != 1.0 || op.postscale != 1.0))
    return invalid("scale factors apply to reductions only");
  if (!op.compression.empty()) {
    const CompressionSetup* setup = nullptr;
    Status status = FindCompression(op.compression, &setup);
    if (!status.ok()) return invalid(status.message());
    if (setup->compressor && op.kind != OpKind::kPushPull)
      return invalid("only push_pull compresses");
  }
  const OpPolicy& policy = OpPolicyFor(op.kind);
  Status status = policy.Check(spec, group);
  if (!status.ok()) return status;
  if (spec.bytes && (!spec.input || (policy.OutputIsInputSized() && !spec.output)))
    return invalid("no input or output memory");
  return Status::OK();
}

void ChooseWireKind(size_t min_compress_bytes, Declaration* op) {
  if (op->compression.empty()) return;
  const CompressionSetup* setup = nullptr;
  const bool compresses = FindCompression(op->compression, &setup).ok() && setup->compressor &&
                          DeclaredBytes(*op) >= min_compress_bytes;
  if (compresses) {
    op->kind = OpKind::kCompressedPushPull;
    op->compression = setup->text;  // every worker declares the same spelling
  } else {
    op->compression.clear();
  }
}

Task::Task(TaskSpec spec, Group group, uint64_t tensor_id, uint64_t order, uint32_t round,
           int timeout_ms, AllocateFn allocate, DoneFn done)
    : spec_(std::move(spec)),
      group_(std::move(group)),
      tensor_id_(tensor_id),
      order_(order),
      round_(round),
      signature_(Signature(spec_.op)),
      declaration_frame_(EncodeDeclaration(spec_.op)),
      declaration_hash_(StableHash(declaration_frame_.data(), declaration_frame_.size())),
      timeout_ms_(timeout_ms),
      deadline_(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms)),
      allocate_(std::move(allocate)),
      output_(spec_.output),
      source_(static_cast<const char*>(spec_.input)),
      done_(std::move(done)) {
  // Checked by CheckTaskSpec before any task is made of the declaration.
  if (kind() == OpKind::kCompressedPushPull &&
      FindCompression(op().compression, &compression_).ok())
    return;
  compression_ = nullptr;
}

Status Task::AllocateOutput(const std::vector<int64_t>& shape) {
  if (output_) return Status::OK();
  if (!allocate_)
    return Status::Error(ErrorKind::kInternal, "no output allocator for tensor '" + name() + "'");
  Status status = Status::OK();
  output_ = allocate_(0, shape, &status);
  if (!output_ && status.ok())
    status = Status::Error(ErrorKind::kInternal, "cannot allocate the output of '" + name() + "'");
  return status;
}

Status Task::SetReceivedSplits(const std::vector<int64_t>& splits) {
  Status status = Status::OK();
  void* out = allocate_ ? allocate_(1, {static_cast<int64_t>(splits.size())}, &status) : nullptr;
  if (!out)
    return status.ok() ? Status::Error(ErrorKind::kInternal,
                                       "cannot allocate the received splits of '" + name() + "'")
                       : status;
  std::memcpy(out, splits.data(), splits.size() * sizeof(int64_t));
  return Status::OK();
}

size_t EvenPartitionBytes(size_t bytes, size_t element, size_t limit, size_t spread,
                          bool across_hosts) {
  if (across_hosts) limit = std::min(limit, kNetworkPartitionBytes);
  const size_t limit_elements = std::max<size_t>(1, limit / element);
  const size_t elements = bytes / element;
  if (elements == 0) return limit_elements * element;
  const size_t pieces = (elements + limit_elements - 1) / limit_elements;
  const size_t even = (pieces + spread - 1) / std::max<size_t>(1, spread) * spread;
  const size_t most = std::max(pieces, bytes / kMinSpreadBytes);
  const size_t count = std::min(even, most);
  return (elements + count - 1) / count * element;
}

int64_t ScatterRows(int64_t rows, int rank, int size) {
  return rows / size + (rank < rows % size ? 1 : 0);
}

int64_t ScatterFirstRow(int64_t rows, int rank, int size) {
  return rank * (rows / size) + std::min<int64_t>(rank, rows % size);
}

std::vector<int> ServerCycle(const std::vector<uint32_t>& shares, size_t num_servers) {
  std::vector<int> cycle;
  if (shares.empty()) {
    for (size_t i = 0; i < num_servers; ++i) cycle.push_back(static_cast<int>(i));
    return cycle;
  }
  int64_t total = 0;
  for (uint32_t share : shares) total += share;
  // Each turn every server earns its share; the richest is picked and pays the total.
  std::vector<int64_t> credit(shares.size(), 0);
  for (int64_t turn = 0; turn < total; ++turn) {
    size_t best = 0;
    for (size_t i = 0; i < shares.size(); ++i) {
      credit[i] += shares[i];
      if (credit[i] > credit[best]) best = i;
    }
    credit[best] -= total;
    cycle.push_back(static_cast<int>(best));
  }
  return cycle;
}

bool Task::BeginIo() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_ || done_called_) return false;
  ++active_io_;
  return true;
}

bool Task::failed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

void Task::EndIo() {
  std::unique_lock<std::mutex> lock(mutex_);
  --active_io_;
  MaybeFinishLocked(lock);
}

void Task::Launch(int partitions) {
  std::unique_lock<std::mutex> lock(mutex_);
  remaining_ += partitions;
  launched_ = true;
  MaybeFinishLocked(lock);
}

void Task::AddPartitions(int count) {
  std::lock_guard<std::mutex> lock(mutex_);
  remaining_ += count;
}

void Task::PartitionDone() {
  std::unique_lock<std::mutex> lock(mutex_);
  --remaining_;
  MaybeFinishLocked(lock);
}

void Task::Fail(const Status& status) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failed_ || done_called_) return;
  failed_ = true;
  error_ = status;
  std::function<void(const Status&)> observer = std::move(on_failure_);
  if (observer) {
    lock.unlock();
    observer(status);
    lock.lock();
  }
  MaybeFinishLocked(lock);
}

void Task::set_on_failure(std::function<void(const Status&)> observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_failure_ = std::move(observer);
}

void Task::MaybeFinishLocked(std::unique_lock<std::mutex>& lock) {
  if (done_called_ || !launched_ || active_io_ > 0 || (!failed_ && remaining_ > 0)) return;
  done_called_ = true;
  Status result = failed_ ? error_ : Status::OK();
  DoneFn done = std::move(done_);
  lock.unlock();
  done(result);
}

PartitionTask MakePartition(const std::shared_ptr<Task>& task, uint32_t part, size_t offset,
                            const char* data, size_t push_length, size_t reply_length) {
  PartitionTask item;
  item.task = task;
  item.part = part;
  item.offset = offset;
  item.data = data;
  item.push_length = push_length;
  item.reply_length = reply_length;
  item.priority = (task->order() << 32) | part;
  item.signature = task->signature();
  return item;
}

}  // namespace bps
