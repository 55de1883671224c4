#include "worker.h"

#include <algorithm>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "logging.h"
#include "reduce.h"

namespace bps {

// ---------------------------------------------------------------------------
// PushPullOp

PushPullOp::PushPullOp(std::string name, uint64_t tensor_id, TensorView view, ReduceOp op,
                       int divisor, int partitions, int timeout_ms, DoneCallback done)
    : name_(std::move(name)),
      tensor_id_(tensor_id),
      view_(std::move(view)),
      op_(op),
      divisor_(divisor),
      timeout_ms_(timeout_ms),
      deadline_(std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms)),
      remaining_(partitions),
      done_(std::move(done)) {}

bool PushPullOp::BeginIo() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_ || done_called_) return false;
  ++active_io_;
  return true;
}

void PushPullOp::EndIo() {
  std::unique_lock<std::mutex> lock(mutex_);
  --active_io_;
  MaybeFinishLocked(lock);
}

void PushPullOp::PartitionDone() {
  std::unique_lock<std::mutex> lock(mutex_);
  --remaining_;
  MaybeFinishLocked(lock);
}

void PushPullOp::Fail(const Status& status) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (failed_ || done_called_) return;
  failed_ = true;
  error_ = status;
  MaybeFinishLocked(lock);
}

void PushPullOp::MaybeFinishLocked(std::unique_lock<std::mutex>& lock) {
  if (done_called_ || active_io_ > 0 || (!failed_ && remaining_ > 0)) return;
  done_called_ = true;
  Status result = failed_ ? error_ : Status::OK();
  DoneCallback done = std::move(done_);
  lock.unlock();
  done(result);
}

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
    pending_[PartitionKey{task.op->tensor_id(), task.part}] =
        Pending{task.op, task.part, task.offset, task.length};
  }
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push(std::move(task));
  }
  queue_cv_.notify_one();
}

void ServerLink::SendLoop() {
  const uint32_t rank = static_cast<uint32_t>(worker_->options().rank);
  while (true) {
    PartitionTask task;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (closing_) return;
      task = queue_.top();
      queue_.pop();
    }
    PushPullOp& op = *task.op;
    if (!op.BeginIo()) continue;  // Failed meanwhile: nothing to send.
    FrameHeader header;
    header.rank = rank;
    header.part = task.part;
    header.tensor_id = op.tensor_id();
    header.signature = task.signature;
    header.dtype = static_cast<uint8_t>(op.view().dtype);
    Status status = SendPartition(task, &header);
    op.EndIo();
    BPS_LOG(kTrace) << "pushed " << op.name() << " part " << task.part << " to " << description();
    if (!status.ok()) {
      worker_->OnLinkFailure(status.message() + " while pushing tensor '" + op.name() + "' to " +
                             description());
      return;
    }
  }
}

Status ServerLink::SendPartition(const PartitionTask& task, FrameHeader* header) {
  const char* data = static_cast<const char*>(task.op->view().input) + task.offset;
  std::lock_guard<std::mutex> lock(conn_->write_mutex());
  if (!task.declare_frame.empty()) {
    header->type = static_cast<uint8_t>(FrameType::kDeclare);
    header->length = task.declare_frame.size();
    Status status = conn_->Send(*header, task.declare_frame.data());
    if (!status.ok()) return status;
  }
  if (!shared_memory_) {
    header->type = static_cast<uint8_t>(FrameType::kPush);
    header->length = task.length;
    return conn_->Send(*header, data);
  }
  const PartitionKey key{task.op->tensor_id(), task.part};
  auto slot = slots_.find(key);
  if (slot == slots_.end() || slot->second.length != task.length) {
    ShmLocation location;
    bool fresh_arena = false;
    Status status = slot_allocator_.Allocate(task.length, &location, &fresh_arena);
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
  std::memcpy(slot_allocator_.Resolve(slot->second), data, task.length);
  header->type = static_cast<uint8_t>(FrameType::kPushShm);
  header->length = sizeof(ShmLocation);
  return conn_->Send(*header, &slot->second);
}

std::shared_ptr<PushPullOp> ServerLink::TakePending(const FrameHeader& header, Pending* pending) {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  auto it = pending_.find(PartitionKey{header.tensor_id, header.part});
  if (it == pending_.end()) return nullptr;
  *pending = it->second;
  pending_.erase(it);
  return pending->op;
}

Status ServerLink::HandleReply(const FrameHeader& header) {
  const auto type = static_cast<FrameType>(header.type);
  // Read the frame's payload first: the stream must stay in step whatever the op's fate.
  std::string message;
  ShmLocation location;
  if (type == FrameType::kError) {
    message.resize(header.length);
    Status status = conn_->ReceivePayload(message.data(), message.size());
    if (!status.ok()) return status;
  } else if (type == FrameType::kReplyShm) {
    if (header.length != sizeof(location))
      return Status::Error("malformed shared-memory reply from " + description());
    Status status = conn_->ReceivePayload(&location, sizeof(location));
    if (!status.ok()) return status;
  }
  Pending pending;
  std::shared_ptr<PushPullOp> op = TakePending(header, &pending);
  if (type == FrameType::kError) {
    if (op) op->Fail(Status::Error(message));
    return Status::OK();
  }
  const bool shared = type == FrameType::kReplyShm;
  if (!op || !op->BeginIo()) return shared ? Status::OK() : conn_->DiscardPayload(header.length);
  const uint64_t length = shared ? location.length : header.length;
  const char* source = shared ? server_arenas_.Resolve(location) : nullptr;
  Status status = Status::OK();
  if (length != pending.length || (shared && !source)) {
    op->EndIo();
    op->Fail(Status::Error(description() + " returned a malformed sum for partition " +
                           std::to_string(header.part) + " of tensor '" + op->name() + "'"));
    return shared ? Status::OK() : conn_->DiscardPayload(header.length);
  }
  void* dst = static_cast<char*>(op->view().output) + pending.offset;
  if (shared) {
    std::memcpy(dst, source, length);
  } else {
    status = conn_->ReceivePayload(dst, length);
  }
  if (status.ok() && op->reduce_op() == ReduceOp::kAverage) {
    const size_t count = length / DataTypeSize(op->view().dtype);
    DivideInPlace(op->view().dtype, dst, count, op->divisor());
  }
  op->EndIo();
  if (!status.ok()) return status;
  op->PartitionDone();
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

void ServerLink::FailPending(const std::string& reason) {
  std::unordered_map<PartitionKey, Pending, PartitionKeyHash> pending;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending.swap(pending_);
  }
  for (auto& entry : pending)
    entry.second.op->Fail(Status::Error(reason + " (tensor '" + entry.second.op->name() + "')"));
}

void ServerLink::FailExpired(std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<std::shared_ptr<PushPullOp>, uint32_t>> expired;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.op->expired(now)) {
        expired.emplace_back(it->second.op, it->second.part);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& entry : expired) {
    entry.first->Fail(Status::Error(
        "push_pull of tensor '" + entry.first->name() + "' timed out after " +
        std::to_string(entry.first->timeout_seconds()) + " s waiting for " + description() +
        " to return partition " + std::to_string(entry.second) +
        " (a worker may not have pushed it; see BYTEPS_OP_TIMEOUT)"));
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
      return Status::Error("worker " + std::to_string(options_.rank) + " cannot reach server " +
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
  return fatal_reason_.empty() ? Status::OK() : Status::Error(fatal_reason_);
}

void Worker::PushPull(const TensorView& view, const std::string& name, ReduceOp op,
                      DoneCallback done) {
  Status fatal = fatal_error();
  if (!fatal.ok()) {
    done(Status::Error(fatal.message() + " (tensor '" + name + "')"));
    return;
  }
  if (stopping_) {
    done(Status::Error("tf_bps is shut down; cannot push_pull tensor '" + name + "'"));
    return;
  }
  const uint64_t signature = TensorSignature(view.dtype, view.shape);
  uint64_t tensor_id, order;
  bool declare;
  {
    std::lock_guard<std::mutex> lock(registry_mutex_);
    auto it = registry_.find(name);
    if (it == registry_.end()) {
      TensorEntry entry;
      entry.id = StableHash(name.data(), name.size());
      entry.order = registry_.size();
      it = registry_.emplace(name, entry).first;
    }
    TensorEntry& entry = it->second;
    if (entry.in_flight) {
      done(Status::Error("tensor '" + name +
                         "' is already being push_pulled; concurrent push_pulls need distinct "
                         "names"));
      return;
    }
    entry.in_flight = true;
    declare = entry.signature != signature;
    entry.signature = signature;
    tensor_id = entry.id;
    order = entry.order;
  }

  if (view.bytes == 0) {
    OnOpFinished(name);
    done(Status::OK());
    return;
  }
  const size_t element = DataTypeSize(view.dtype);
  // Partitions hold whole elements so that servers and averaging never split one.
  const size_t partition = std::max(element, options_.partition_bytes / element * element);
  const int partitions = static_cast<int>((view.bytes + partition - 1) / partition);
  const int divisor = op == ReduceOp::kAverage ? options_.size : 1;
  auto push_pull = std::make_shared<PushPullOp>(
      name, tensor_id, view, op, divisor, partitions, options_.timeout_ms,
      [this, name, done = std::move(done)](const Status& status) {
        OnOpFinished(name);
        done(status);
      });

  std::string declare_frame;
  if (declare) declare_frame = EncodeDeclaration(Declaration{name, view.dtype, view.shape});
  const size_t num_servers = links_.size();
  std::vector<bool> declared(num_servers, false);
  for (int part = 0; part < partitions; ++part) {
    const size_t server = (tensor_id % num_servers + part) % num_servers;
    PartitionTask task;
    task.op = push_pull;
    task.part = static_cast<uint32_t>(part);
    task.offset = static_cast<size_t>(part) * partition;
    task.length = std::min(partition, view.bytes - task.offset);
    task.priority = (order << 32) | static_cast<uint64_t>(part);
    task.signature = signature;
    if (declare && !declared[server]) {
      task.declare_frame = declare_frame;
      declared[server] = true;
    }
    links_[server]->Enqueue(std::move(task));
  }
}

void Worker::OnOpFinished(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex_);
  auto it = registry_.find(name);
  if (it != registry_.end()) it->second.in_flight = false;
}

void Worker::OnLinkFailure(const std::string& reason) {
  BPS_LOG(kError) << reason;
  Abort(reason);
}

void Worker::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(fatal_mutex_);
    if (fatal_reason_.empty()) fatal_reason_ = reason;
  }
  for (auto& link : links_) link->FailPending(reason);
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
    link->FailPending("tf_bps was shut down while a push_pull was in flight");
  }
  BPS_LOG(kInfo) << "worker " << options_.rank << " stopped";
}

}  // namespace bps
