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

void ServerLink::Declare(uint64_t tensor_id, const std::string& frame) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kDeclare);
  header.rank = static_cast<uint32_t>(worker_->options().rank);
  header.tensor_id = tensor_id;
  header.length = frame.size();
  std::lock_guard<std::mutex> lock(conn_->write_mutex());
  // A broken connection is reported by this link's own threads.
  Status status = conn_->Send(header, frame.data());
  if (!status.ok()) BPS_LOG(kDebug) << status.message();
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
  const char* source = shared ? server_arenas_.Resolve(location) : nullptr;
  if (length != pending.reply_length || (shared && !source)) {
    task.Fail(Status::Error(ErrorKind::kInternal,
                            description() + " returned a malformed result (" +
                                std::to_string(length) + " bytes where " +
                                std::to_string(pending.reply_length) + " were due) for partition " +
                                std::to_string(header.part) + " of tensor '" + task.name() + "'"));
    return discard();
  }
  if (!task.BeginIo()) return discard();
  // An allgather's replies start with every worker's row count.
  const size_t table_bytes =
      task.kind() == OpKind::kAllgather ? AllgatherTableBytes(worker_->options().size) : 0;
  std::vector<char> table(table_bytes);
  Status status = Status::OK();
  if (shared) {
    std::memcpy(table.data(), source, table_bytes);
    source += table_bytes;
  } else {
    status = conn_->ReceivePayload(table.data(), table_bytes);
  }
  if (status.ok() && task.kind() == OpKind::kAllgather && header.part == kAllgatherSizesPart) {
    // The first step of an allgather: now the output's size and this worker's place
    // in it are known, and the rows can move.
    Status sized = worker_->StartAllgatherData(pending.task, table.data());
    task.EndIo();
    if (!sized.ok()) {
      task.Fail(sized);
    } else {
      task.PartitionDone();
    }
    return Status::OK();
  }
  const size_t data_bytes = length - table_bytes;
  void* dst = static_cast<char*>(task.output()) + pending.offset;
  if (!status.ok()) {
    // The stream is broken; the link failure fails the task.
  } else if (shared) {
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
  // An allgather starts with one partition (the row counts) and adds the rest later.
  const int partitions = spec.op.kind == OpKind::kAllgather
                             ? 1
                             : static_cast<int>((spec.bytes + partition - 1) / partition);
  const OpKind kind = spec.op.kind;
  auto task = std::make_shared<Task>(
      std::move(spec), entry.id, entry.order, entry.round, partitions, options_.timeout_ms,
      std::move(allocate),
      [this, name, kind, id = entry.id, round = entry.round,
       done = std::move(done)](const Status& status) {
        OnTaskFinished(name, kind, id, round, status);
        done(status);
      });
  if (partitions == 0) {  // Nothing to move (the tensor is empty on every worker too).
    task->PartitionDone();  // Counts below zero: the task completes at once.
    return;
  }
  Dispatch(task, declare, partition);
}

ServerLink& Worker::LinkFor(uint64_t tensor_id, uint32_t part) {
  const size_t num_servers = links_.size();
  return *links_[(tensor_id % num_servers + part) % num_servers];
}

void Worker::Dispatch(const std::shared_ptr<Task>& task, bool declare, size_t partition) {
  const TaskSpec& spec = task->spec();
  const Declaration& op = spec.op;
  const char* source = static_cast<const char*>(spec.input);
  if (op.kind == OpKind::kPushPull && op.prescale != 1.0) {
    // Scale a copy: the input belongs to the framework. The output is ours until
    // the task completes, and each partition's result arrives only after its push.
    if (spec.output != spec.input) std::memcpy(spec.output, spec.input, spec.bytes);
    ScaleInPlace(op.dtype, spec.output, spec.bytes / DataTypeSize(op.dtype), op.prescale);
    source = static_cast<const char*>(spec.output);
  }
  const bool broadcast_root = op.kind == OpKind::kBroadcast && op.root_rank == options_.rank;
  if (broadcast_root && spec.output != spec.input) std::memcpy(spec.output, spec.input, spec.bytes);

  PartitionTask item;
  item.task = task;
  item.signature = Signature(op);
  if (declare) item.declare_frame = EncodeDeclaration(op);
  if (op.kind == OpKind::kAllgather) {
    // Every server that will see this allgather's rows learns what it is now.
    item.part = kAllgatherSizesPart;
    item.offset = 0;
    item.data = nullptr;
    item.push_length = 0;
    item.reply_length = AllgatherTableBytes(options_.size);
    item.priority = task->order() << 32;
    if (declare) {
      for (auto& link : links_) {
        if (link.get() == &LinkFor(task->tensor_id(), item.part)) continue;
        link->Declare(task->tensor_id(), item.declare_frame);
      }
    }
    LinkFor(task->tensor_id(), item.part).Enqueue(std::move(item));
    return;
  }
  std::vector<bool> declared(links_.size(), false);
  const std::string declare_frame = std::move(item.declare_frame);
  const int partitions = static_cast<int>((spec.bytes + partition - 1) / partition);
  for (int part = 0; part < partitions; ++part) {
    item.part = static_cast<uint32_t>(part);
    item.offset = static_cast<size_t>(part) * partition;
    const size_t length = std::min(partition, spec.bytes - item.offset);
    item.data = source + item.offset;
    if (op.kind == OpKind::kPushPull) {
      item.push_length = item.reply_length = length;
    } else {  // Broadcast: the root's data crosses once; receivers send nothing.
      item.push_length = broadcast_root ? length : 0;
      item.reply_length = broadcast_root ? 0 : length;
    }
    item.priority = (task->order() << 32) | static_cast<uint64_t>(part);
    const size_t server = (task->tensor_id() % links_.size() + part) % links_.size();
    item.declare_frame.clear();
    if (declare && !declared[server]) {
      item.declare_frame = declare_frame;
      declared[server] = true;
    }
    links_[server]->Enqueue(item);
  }
}

Status Worker::StartAllgatherData(const std::shared_ptr<Task>& task, const char* table) {
  const TaskSpec& spec = task->spec();
  const std::vector<int64_t>& shape = spec.op.shape;
  size_t row_bytes = DataTypeSize(spec.op.dtype);
  for (size_t i = 1; i < shape.size(); ++i) row_bytes *= static_cast<size_t>(shape[i]);
  std::vector<int64_t> rows(options_.size);
  std::memcpy(rows.data(), table, rows.size() * sizeof(int64_t));
  int64_t total = 0, before = 0;
  for (int r = 0; r < options_.size; ++r) {
    // Bounded so that the sums below cannot overflow whatever a server sends.
    if (rows[r] < 0 || rows[r] > (int64_t{1} << 40))
      return Status::Error(ErrorKind::kInternal, "a server reported " + std::to_string(rows[r]) +
                                                     " rows for worker rank " + std::to_string(r) +
                                                     " in allgather of tensor '" + spec.op.name + "'");
    if (r < options_.rank) before += rows[r];
    total += rows[r];
  }
  if (rows[options_.rank] != shape[0])
    return Status::Error(ErrorKind::kInternal, "a server misreported this worker's rows in "
                                               "allgather of tensor '" + spec.op.name + "'");
  std::vector<int64_t> out_shape = shape;
  out_shape[0] = total;
  Status status = task->AllocateOutput(out_shape);
  if (!status.ok()) return status;

  // Partitions cut the concatenated result; each worker sends the part of its rows
  // that falls into each (often none), and each reply lands at its place in the output.
  const size_t result_bytes = static_cast<size_t>(total) * row_bytes;
  const size_t mine_begin = static_cast<size_t>(before) * row_bytes;
  const size_t mine_end = mine_begin + spec.bytes;
  const size_t partition = std::max<size_t>(1, options_.partition_bytes);
  const int partitions = static_cast<int>((result_bytes + partition - 1) / partition);
  task->AddPartitions(partitions);
  const uint64_t signature = Signature(spec.op);
  for (int p = 0; p < partitions; ++p) {
    PartitionTask item;
    item.task = task;
    item.part = static_cast<uint32_t>(p) + 1;
    item.offset = static_cast<size_t>(p) * partition;
    const size_t end = std::min(item.offset + partition, result_bytes);
    const size_t from = std::max(item.offset, mine_begin), to = std::min(end, mine_end);
    item.push_length = from < to ? to - from : 0;
    item.data = static_cast<const char*>(spec.input) + (from < to ? from - mine_begin : 0);
    item.reply_length = AllgatherTableBytes(options_.size) + (end - item.offset);
    item.priority = (task->order() << 32) | item.part;
    item.signature = signature;
    LinkFor(task->tensor_id(), item.part).Enqueue(std::move(item));
  }
  return Status::OK();
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
