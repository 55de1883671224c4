#include "worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "logging.h"
#include "reduce.h"

namespace bps {

// ---------------------------------------------------------------------------
// ServerLink

ServerLink::ServerLink(Worker* worker, int index, ServerAddress address,
                       std::unique_ptr<Connection> conn, bool shared_memory)
    : worker_(worker),
      index_(index),
      address_(std::move(address)),
      conn_(std::move(conn)),
      shared_memory_(shared_memory) {}

ServerLink::~ServerLink() { Join(); }

std::string ServerLink::description() const {
  return "server " + std::to_string(index_) + " (" + address_.host + ":" +
         std::to_string(address_.port) + ")";
}

void ServerLink::Start() {
  sender_ = std::thread([this] { SendLoop(); });
  receiver_ = std::thread([this] { ReceiveLoop(); });
}

void ServerLink::Enqueue(PartitionTask task) {
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending_[PartitionKey{task.task->tensor_id(), task.part}] =
        Pending{task.task, task.part, task.offset, task.reply_length};
  }
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push(std::move(task));
  }
  queue_cv_.notify_one();
}

void ServerLink::Abandon(uint64_t tensor_id, uint32_t round, OpKind kind) {
  std::vector<uint32_t> parts;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->first.tensor_id == tensor_id && it->second.task->round() == round) {
        parts.push_back(it->second.part);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (parts.empty() || worker_->stopping()) return;
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kAbandon);
  header.op_kind = static_cast<uint8_t>(kind);
  header.rank = static_cast<uint32_t>(worker_->options().rank);
  header.tensor_id = tensor_id;
  header.round = round;
  std::lock_guard<std::mutex> lock(conn_->write_mutex());
  for (uint32_t part : parts) {
    header.part = part;
    // Best effort: if the server is gone, its rounds are gone with it.
    if (!conn_->Send(header, nullptr).ok()) return;
  }
}

void ServerLink::SendLoop() {
  const uint32_t rank = static_cast<uint32_t>(worker_->options().rank);
  while (true) {
    PartitionTask partition;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (closing_) return;
      partition = queue_.top();
      queue_.pop();
    }
    Task& task = *partition.task;
    if (!task.BeginIo()) continue;  // Failed meanwhile: nothing to send.
    FrameHeader header;
    header.rank = rank;
    header.part = partition.part;
    header.round = task.round();
    header.op_kind = static_cast<uint8_t>(task.kind());
    header.tensor_id = task.tensor_id();
    header.signature = partition.signature;
    header.dtype = static_cast<uint8_t>(task.dtype());
    header.reduce_op = static_cast<uint8_t>(task.op().reduce_op);
    if (task.kind() == OpKind::kAllgather) header.rows = task.op().shape[0];
    Status status = SendPartition(partition, &header);
    task.EndIo();
    BPS_LOG(kTrace) << "pushed " << task.name() << " part " << partition.part << " round "
                    << task.round() << " to " << description();
    if (!status.ok()) {
      worker_->OnLinkFailure(status.message() + " while pushing tensor '" + task.name() +
                             "' to " + description());
      return;
    }
  }
}

Status ServerLink::SendPartition(const PartitionTask& partition, FrameHeader* header) {
  std::lock_guard<std::mutex> lock(conn_->write_mutex());
  if (!partition.declare_frame.empty()) {
    header->type = static_cast<uint8_t>(FrameType::kDeclare);
    header->length = partition.declare_frame.size();
    Status status = conn_->Send(*header, partition.declare_frame.data());
    if (!status.ok()) return status;
  }
  // Empty pushes (a broadcast receiver's "I am here") need no shared slot.
  if (!shared_memory_ || partition.push_length == 0) {
    header->type = static_cast<uint8_t>(FrameType::kPush);
    header->length = partition.push_length;
    return conn_->Send(*header, partition.data);
  }
  const PartitionKey key{partition.task->tensor_id(), partition.part};
  auto slot = slots_.find(key);
  if (slot == slots_.end() || slot->second.length != partition.push_length) {
    ShmLocation location;
    bool fresh_arena = false;
    Status status = slot_allocator_.Allocate(partition.push_length, &location, &fresh_arena);
    if (!status.ok()) return status;
    if (fresh_arena) {
      const SharedArena& arena = slot_allocator_.arena(location.arena);
      ArenaAnnouncement announcement{location.arena, 0, arena.size()};
      FrameHeader frame;
      frame.type = static_cast<uint8_t>(FrameType::kArena);
      frame.length = sizeof(announcement);
      status = conn_->Send(frame, &announcement, arena.fd());
      if (!status.ok()) return status;
    }
    slot = slots_.insert_or_assign(key, location).first;
  }
  std::memcpy(slot_allocator_.Resolve(slot->second), partition.data, partition.push_length);
  header->type = static_cast<uint8_t>(FrameType::kPushShm);
  header->length = sizeof(ShmLocation);
  return conn_->Send(*header, &slot->second);
}

bool ServerLink::TakePending(const FrameHeader& header, Pending* pending) {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  auto it = pending_.find(PartitionKey{header.tensor_id, header.part});
  // A reply for another round answers a task that already failed: never use it.
  if (it == pending_.end() || it->second.task->round() != header.round) return false;
  *pending = it->second;
  pending_.erase(it);
  return true;
}

Status ServerLink::PrepareAllgather(Task& task, const char* table, uint64_t length,
                                    size_t* data_bytes) {
  const int size = worker_->options().size;
  const std::vector<int64_t>& shape = task.op().shape;
  size_t row_bytes = DataTypeSize(task.dtype());
  for (size_t i = 1; i < shape.size(); ++i) row_bytes *= static_cast<size_t>(shape[i]);
  int64_t rows = 0;
  for (int r = 0; r < size; ++r) {
    int64_t count;
    std::memcpy(&count, table + r * sizeof(int64_t), sizeof(count));
    if (count < 0) rows = -1;
    if (rows >= 0) rows += count;
  }
  const size_t table_bytes = AllgatherTableBytes(size);
  if (rows < 0 || length - table_bytes != static_cast<uint64_t>(rows) * row_bytes)
    return Status::Error(ErrorKind::kInternal, description() +
                                                   " returned a malformed allgather of tensor '" +
                                                   task.name() + "'");
  std::vector<int64_t> out_shape = shape;
  out_shape[0] = rows;
  *data_bytes = length - table_bytes;
  return task.AllocateOutput(out_shape);
}

void ServerLink::FinishPartition(const Task& task, void* data, size_t bytes) {
  if (task.kind() != OpKind::kPushPull) return;
  const Declaration& op = task.op();
  const size_t count = bytes / DataTypeSize(op.dtype);
  if (op.reduce_op == ReduceOp::kAverage) DivideInPlace(op.dtype, data, count, worker_->options().size);
  ScaleInPlace(op.dtype, data, count, op.postscale);
}

Status ServerLink::HandleReply(const FrameHeader& header) {
  const auto type = static_cast<FrameType>(header.type);
  // Read the frame's control payload first: the stream must stay in step whatever
  // the task's fate.
  std::string message;
  ShmLocation location;
  if (type == FrameType::kError) {
    if (header.length > (1u << 20)) return Status::Error(description() + " sent an oversized error");
    message.resize(header.length);
    Status status = conn_->ReceivePayload(message.data(), message.size());
    if (!status.ok()) return status;
  } else if (type == FrameType::kReplyShm) {
    if (header.length != sizeof(location))
      return Status::Error("malformed shared-memory reply from " + description());
    Status status = conn_->ReceivePayload(&location, sizeof(location));
    if (!status.ok()) return status;
  }
  const bool shared = type == FrameType::kReplyShm;
  const uint64_t length = shared ? location.length : header.length;
  auto discard = [&] { return shared ? Status::OK() : conn_->DiscardPayload(length); };
  Pending pending;
  if (!TakePending(header, &pending)) return type == FrameType::kError ? Status::OK() : discard();
  Task& task = *pending.task;
  if (type == FrameType::kError) {
    const uint8_t kind = header.error_kind;
    task.Fail(Status::Error(kind <= static_cast<uint8_t>(ErrorKind::kShutdown)
                                ? static_cast<ErrorKind>(kind)
                                : ErrorKind::kInternal,
                            message));
    return Status::OK();
  }
  if (!task.BeginIo()) return discard();
  const char* source = shared ? server_arenas_.Resolve(location) : nullptr;
  Status status = Status::OK();
  size_t data_bytes = length;
  const char* table = nullptr;
  std::vector<char> table_copy;
  if (shared && !source) {
    status = Status::Error(ErrorKind::kInternal, "points outside its shared memory");
  } else if (task.kind() == OpKind::kAllgather) {
    const size_t table_bytes = AllgatherTableBytes(worker_->options().size);
    if (length < table_bytes) {
      status = Status::Error(ErrorKind::kInternal, "sent a short allgather");
    } else if (shared) {
      table = source;
      source += table_bytes;
    } else {
      table_copy.resize(table_bytes);
      status = conn_->ReceivePayload(table_copy.data(), table_bytes);
      if (!status.ok()) {
        task.EndIo();
        return status;  // The stream is broken.
      }
      table = table_copy.data();
    }
    if (status.ok()) status = PrepareAllgather(task, table, length, &data_bytes);
    if (!status.ok() && !shared) {
      task.EndIo();
      task.Fail(status);
      return conn_->DiscardPayload(length - table_bytes);
    }
  } else if (length != pending.reply_length) {
    status = Status::Error(ErrorKind::kInternal,
                           "returned " + std::to_string(length) + " bytes where " +
                               std::to_string(pending.reply_length) + " were due");
  }
  if (!status.ok()) {
    task.EndIo();
    task.Fail(Status::Error(status.kind(), description() + " " + status.message() +
                                               " (partition " + std::to_string(header.part) +
                                               " of tensor '" + task.name() + "')"));
    return discard();
  }
  void* dst = static_cast<char*>(task.output()) + pending.offset;
  if (shared) {
    if (data_bytes) std::memcpy(dst, source, data_bytes);
  } else {
    status = conn_->ReceivePayload(dst, data_bytes);
  }
  if (status.ok()) FinishPartition(task, dst, data_bytes);
  task.EndIo();
  if (!status.ok()) return status;
  task.PartitionDone();
  return Status::OK();
}

Status ServerLink::HandleArena() {
  ArenaAnnouncement announcement;
  const int fd = conn_->TakeReceivedFd();
  Status status = conn_->ReceivePayload(&announcement, sizeof(announcement));
  if (!status.ok() || fd < 0) {
    if (fd >= 0) ::close(fd);
    return status.ok() ? Status::Error(description() + " announced memory without a descriptor")
                       : status;
  }
  return server_arenas_.Add(announcement.index, fd, announcement.size);
}

void ServerLink::ReceiveLoop() {
  while (true) {
    FrameHeader header;
    bool eof = false;
    Status status = conn_->ReceiveHeader(&header, &eof);
    if (status.ok()) {
      const auto type = static_cast<FrameType>(header.type);
      if (type == FrameType::kReply || type == FrameType::kReplyShm ||
          type == FrameType::kError) {
        status = HandleReply(header);
      } else if (type == FrameType::kArena && header.length == sizeof(ArenaAnnouncement)) {
        status = HandleArena();
      } else {
        status = Status::Error("unexpected frame type " + std::to_string(header.type) + " from " +
                               description());
      }
    }
    if (!status.ok()) {
      if (!worker_->stopping()) worker_->OnLinkFailure(status.message());
      return;
    }
  }
}

void ServerLink::FailPending(const Status& reason) {
  std::unordered_map<PartitionKey, Pending, PartitionKeyHash> pending;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending.swap(pending_);
  }
  for (auto& entry : pending)
    entry.second.task->Fail(reason.WithSuffix(" (tensor '" + entry.second.task->name() + "')"));
}

void ServerLink::FailExpired(std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<std::shared_ptr<Task>, uint32_t>> expired;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (const auto& entry : pending_)
      if (entry.second.task->expired(now)) expired.emplace_back(entry.second.task, entry.second.part);
  }
  for (auto& [task, part] : expired) {
    task->Fail(Status::Error(
        ErrorKind::kTimeout,
        std::string(OpKindName(task->kind())) + " of tensor '" + task->name() + "' (round " +
            std::to_string(task->round()) + ") timed out after " +
            std::to_string(task->timeout_seconds()) + " s waiting for " + description() +
            " to return partition " + std::to_string(part) +
            " (a worker may not have sent it; see BYTEPS_OP_TIMEOUT)"));
  }
}

void ServerLink::Close(int rank) {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    closing_ = true;
  }
  queue_cv_.notify_all();
  if (sender_.joinable()) sender_.join();
  FrameHeader bye;
  bye.type = static_cast<uint8_t>(FrameType::kBye);
  bye.rank = static_cast<uint32_t>(rank);
  {
    std::lock_guard<std::mutex> lock(conn_->write_mutex());
    conn_->Send(bye, nullptr);  // Best effort: the server may be gone already.
  }
  conn_->Shutdown();
}

void ServerLink::Join() {
  if (sender_.joinable()) sender_.join();
  if (receiver_.joinable()) receiver_.join();
}

// ---------------------------------------------------------------------------
// Worker

Worker::Worker(WorkerOptions options) : options_(std::move(options)) {}

Worker::~Worker() { Stop(); }

Status Worker::Start() {
  if (options_.servers.empty()) return Status::Error("no servers to connect to");
  for (size_t i = 0; i < options_.servers.size(); ++i) {
    const ServerAddress& address = options_.servers[i];
    int fd = -1;
    Status status = Status::Error("not on this host");
    if (address.same_host) status = ConnectLocal(address.port, options_.timeout_ms, &fd);
    const bool local = status.ok();
    if (local)
      BPS_LOG(kDebug) << "server " << i << " is on this host: using its Unix socket";
    else
      status = ConnectTcp(address.host, address.port, options_.timeout_ms, options_.timeout_ms, &fd);
    if (!status.ok())
      return Status::Error(ErrorKind::kPeerGone,
                           "worker " + std::to_string(options_.rank) + " cannot reach server " +
                               std::to_string(i) + ": " + status.message());
    auto conn = std::make_unique<Connection>(
        fd, "server " + std::to_string(i) + " (" + address.host + ":" +
                std::to_string(address.port) + ")");
    FrameHeader hello;
    hello.type = static_cast<uint8_t>(FrameType::kHello);
    hello.rank = static_cast<uint32_t>(options_.rank);
    status = conn->Send(hello, nullptr);
    if (!status.ok()) return status;
    links_.push_back(std::make_unique<ServerLink>(this, static_cast<int>(i), address,
                                                  std::move(conn), local));
  }
  for (auto& link : links_) link->Start();
  watchdog_ = std::thread([this] { WatchdogLoop(); });
  BPS_LOG(kInfo) << "worker " << options_.rank << " of " << options_.size << " connected to "
                 << links_.size() << " server(s)";
  return Status::OK();
}

Status Worker::fatal_error() {
  std::lock_guard<std::mutex> lock(fatal_mutex_);
  return fatal_;
}

void Worker::Enqueue(TaskSpec spec, AllocateFn allocate, DoneFn done) {
  const std::string name = spec.op.name;
  Status status = fatal_error();
  if (!status.ok()) {
    done(status.WithSuffix(" (tensor '" + name + "')"));
    return;
  }
  if (stopping_) {
    done(Status::Error(ErrorKind::kShutdown,
                       "tf_bps is shut down; cannot run tensor '" + name + "'"));
    return;
  }
  status = CheckTaskSpec(spec, options_.size);
  if (!status.ok()) {
    done(status);
    return;
  }
  const uint64_t signature = Signature(spec.op);
  TensorEntry entry;
  bool declare;
  {
    std::lock_guard<std::mutex> lock(registry_mutex_);
    auto it = registry_.find(name);
    if (it == registry_.end()) {
      TensorEntry fresh;
      fresh.id = StableHash(name.data(), name.size());
      fresh.order = registry_.size();
      it = registry_.emplace(name, fresh).first;
    }
    if (it->second.in_flight) {
      done(Status::Error(ErrorKind::kInvalidArgument,
                         "tensor '" + name +
                             "' is already in flight; concurrent operations need distinct names"));
      return;
    }
    it->second.in_flight = true;
    ++it->second.round;
    declare = it->second.signature != signature;
    it->second.signature = signature;
    entry = it->second;
  }
  const size_t element = DataTypeSize(spec.op.dtype);
  // Partitions hold whole elements so that servers and averaging never split one.
  const size_t partition = std::max(element, options_.partition_bytes / element * element);
  // An allgather is one piece: its size differs by worker, so partitions would not line up.
  const int partitions = spec.op.kind == OpKind::kAllgather
                             ? 1
                             : static_cast<int>((spec.bytes + partition - 1) / partition);
  const OpKind kind = spec.op.kind;
  auto task = std::make_shared<Task>(
      std::move(spec), entry.id, entry.round, partitions, options_.timeout_ms, std::move(allocate),
      [this, name, kind, id = entry.id, round = entry.round,
       done = std::move(done)](const Status& status) {
        OnTaskFinished(name, kind, id, round, status);
        done(status);
      });
  if (partitions == 0) {  // Nothing to move (the tensor is empty on every worker too).
    task->PartitionDone();  // Counts below zero: the task completes at once.
    return;
  }
  Dispatch(task, entry, declare, partition);
}

void Worker::Dispatch(const std::shared_ptr<Task>& task, const TensorEntry& entry, bool declare,
                      size_t partition) {
  const TaskSpec& spec = task->spec();
  const Declaration& op = spec.op;
  const int rank = options_.rank;
  const char* source = static_cast<const char*>(spec.input);
  if (op.kind == OpKind::kPushPull && op.prescale != 1.0) {
    // Scale a copy: the input belongs to the framework. The output is ours until
    // the task completes, and each partition's result arrives only after its push.
    if (spec.output != spec.input) std::memcpy(spec.output, spec.input, spec.bytes);
    ScaleInPlace(op.dtype, spec.output, spec.bytes / DataTypeSize(op.dtype), op.prescale);
    source = static_cast<const char*>(spec.output);
  }
  const bool broadcast_root = op.kind == OpKind::kBroadcast && op.root_rank == rank;
  if (broadcast_root && spec.output != spec.input) std::memcpy(spec.output, spec.input, spec.bytes);

  std::string declare_frame;
  if (declare) declare_frame = EncodeDeclaration(op);
  const uint64_t signature = Signature(op);
  const size_t num_servers = links_.size();
  std::vector<bool> declared(num_servers, false);
  const int partitions = op.kind == OpKind::kAllgather
                             ? 1
                             : static_cast<int>((spec.bytes + partition - 1) / partition);
  for (int part = 0; part < partitions; ++part) {
    const size_t server = (entry.id % num_servers + part) % num_servers;
    PartitionTask item;
    item.task = task;
    item.part = static_cast<uint32_t>(part);
    item.offset = static_cast<size_t>(part) * partition;
    const size_t length =
        op.kind == OpKind::kAllgather ? spec.bytes : std::min(partition, spec.bytes - item.offset);
    item.data = source + item.offset;
    switch (op.kind) {
      case OpKind::kPushPull:
        item.push_length = item.reply_length = length;
        break;
      case OpKind::kBroadcast:  // The root's data crosses once; receivers send nothing.
        item.push_length = broadcast_root ? length : 0;
        item.reply_length = broadcast_root ? 0 : length;
        break;
      case OpKind::kAllgather:
        item.push_length = length;
        item.reply_length = 0;  // Unknown until the server has every worker's rows.
        break;
    }
    item.priority = (entry.order << 32) | static_cast<uint64_t>(part);
    item.signature = signature;
    if (declare && !declared[server]) {
      item.declare_frame = declare_frame;
      declared[server] = true;
    }
    links_[server]->Enqueue(std::move(item));
  }
}

void Worker::OnTaskFinished(const std::string& name, OpKind kind, uint64_t tensor_id,
                            uint32_t round, const Status& status) {
  // Before the name is free again: the next round's pushes must follow the abandon.
  if (!status.ok())
    for (auto& link : links_) link->Abandon(tensor_id, round, kind);
  std::lock_guard<std::mutex> lock(registry_mutex_);
  auto it = registry_.find(name);
  if (it != registry_.end()) it->second.in_flight = false;
}

void Worker::OnLinkFailure(const std::string& reason) {
  BPS_LOG(kError) << reason;
  Abort(reason);
}

void Worker::Abort(const std::string& reason) {
  const Status status = Status::Error(ErrorKind::kPeerGone, reason);
  {
    std::lock_guard<std::mutex> lock(fatal_mutex_);
    if (fatal_.ok()) fatal_ = status;
  }
  for (auto& link : links_) link->FailPending(status);
}

void Worker::WatchdogLoop() {
  std::unique_lock<std::mutex> lock(watchdog_mutex_);
  while (!stopping_) {
    watchdog_cv_.wait_for(lock, std::chrono::milliseconds(250));
    if (stopping_) break;
    const auto now = std::chrono::steady_clock::now();
    for (auto& link : links_) link->FailExpired(now);
  }
}

void Worker::Stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(watchdog_mutex_);
  }
  watchdog_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  for (auto& link : links_) link->Close(options_.rank);
  for (auto& link : links_) {
    link->Join();
    link->FailPending(Status::Error(ErrorKind::kShutdown,
                                    "tf_bps was shut down while an operation was in flight"));
  }
  BPS_LOG(kInfo) << "worker " << options_.rank << " stopped";
}

}  // namespace bps
