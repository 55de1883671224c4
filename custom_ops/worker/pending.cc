#include "pending.h"

#include "device_staging.h"

namespace bps {
namespace {

constexpr size_t kMaxErrorBytes = 1u << 20;

}  // namespace

PendingPartition PendingPartition::Of(const PartitionTask& partition, int peer) {
  PendingPartition pending;
  static_cast<PartitionTask&>(pending) = partition;
  pending.peer = peer;
  return pending;
}

void PendingTable::Add(PendingPartition partition) {
  std::lock_guard<std::mutex> lock(mutex_);
  const PartitionKey key{partition.task->tensor_id(), partition.part};
  pending_[key] = std::move(partition);
}

bool PendingTable::Take(const FrameHeader& header, int peer, PendingPartition* partition) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(PartitionKey{header.tensor_id, header.part});
  if (it == pending_.end() || it->second.task->round() != header.round || it->second.peer != peer)
    return false;
  *partition = std::move(it->second);
  pending_.erase(it);
  return true;
}

bool PendingTable::Update(const std::shared_ptr<Task>& task, uint32_t part,
                          const std::function<void(PendingPartition&)>& change) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(PartitionKey{task->tensor_id(), part});
  if (it == pending_.end() || it->second.task != task) return false;
  change(it->second);
  return true;
}

std::vector<PendingPartition> PendingTable::TakeIf(
    const std::function<bool(const PendingPartition&)>& which) {
  std::vector<PendingPartition> taken;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (which && !which(it->second)) {
      ++it;
      continue;
    }
    taken.push_back(std::move(it->second));
    it = pending_.erase(it);
  }
  return taken;
}

std::vector<PendingPartition> PendingTable::Expired(std::chrono::steady_clock::time_point now) {
  std::vector<PendingPartition> expired;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, partition] : pending_)
    if (partition.task->expired(now)) expired.push_back(partition);
  return expired;
}

Status ReadAnswerError(const FrameHeader& header, DataReader* payload, const std::string& from,
                       Status* error) {
  if (header.length > kMaxErrorBytes) return Status::Error(from + " sent an oversized error");
  std::string message(header.length, '\0');
  Status status = payload->Read(message.data(), message.size());
  if (!status.ok()) return status;
  const ErrorKind kind = header.error_kind <= static_cast<uint8_t>(ErrorKind::kShutdown)
                             ? static_cast<ErrorKind>(header.error_kind)
                             : ErrorKind::kInternal;
  *error = Status::Error(kind, std::move(message));
  return Status::OK();
}

Status ReadAnswer(const FrameHeader& header, DataReader* payload, const PendingPartition& pending,
                  const std::string& from, bool raw,
                  const std::function<void(void*, size_t)>& finish,
                  const CompressionSetup* compression) {
  Task& task = *pending.task;
  const size_t elements = pending.reply_length / sizeof(float);
  const size_t due =
      compression ? compression->compressor->CompressedBytes(elements) : pending.reply_length;
  auto malformed = [&](const std::string& what) {
    task.Fail(Status::Error(ErrorKind::kInternal,
                            from + " returned a malformed result (" + what + ") for partition " +
                                std::to_string(header.part) + " of tensor '" + task.name() + "'"));
  };
  if (header.length != due) {
    malformed(std::to_string(header.length) + " bytes where " + std::to_string(due) + " were due");
    return payload->Skip();
  }
  if (!task.BeginIo()) return payload->Skip();
  void* dst = static_cast<char*>(task.output()) + pending.offset;
  Status status = Status::OK();
  bool valid = true;
  if (compression) {
    // Read whole first (shared memory too), so that what is checked is what is used.
    thread_local std::vector<char> wire;
    wire.resize(due);
    status = payload->Read(wire.data(), due);
    valid = status.ok() && compression->compressor->Valid(wire.data(), elements);
    if (valid) compression->compressor->Decompress(wire.data(), elements, static_cast<float*>(dst));
  } else {
    status = payload->Read(dst, pending.reply_length);
  }
  if (status.ok() && valid && finish) finish(dst, pending.reply_length);
  task.EndIo();
  if (status.ok() && !valid) {
    malformed("not a well-formed '" + compression->text + "' partition");
    return status;
  }
  if (status.ok()) {
    Delivered(pending.task, pending.offset, pending.reply_length, raw);
  } else {
    // Half an answer: the output (perhaps the input too) is spoilt, and the partition
    // cannot be sent again.
    task.Fail(Status::Error(ErrorKind::kPeerGone, "the answer for partition " +
                                                      std::to_string(header.part) + " of tensor '" +
                                                      task.name() + "' broke off from " + from +
                                                      ": " + status.message()));
  }
  return status;
}

}  // namespace bps
