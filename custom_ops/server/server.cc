#include "server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "../core/logging.h"
#include "../core/reduce.h"

namespace bps {
namespace {

// Items a reader may hand to the engines before it stops reading from its worker;
// bounds server memory to the sum buffers plus this many blocks per worker.
constexpr int kMaxOutstandingPerWorker = 16;
constexpr size_t kMaxPooledBlocks = 64;

}  // namespace

struct Server::WorkerConn {
  WorkerConn(std::unique_ptr<Connection> c, bool same_host)
      : conn(std::move(c)), local(same_host) {}
  std::unique_ptr<Connection> conn;
  const bool local;  // On this host: data goes through shared memory both ways.
  PeerArenas arenas;  // The worker's push slots.
  uint32_t announced_results = 0;  // Result arenas sent to it; guarded by the write mutex.
  int rank = -1;
  std::mutex mutex;
  std::condition_variable cv;
  int outstanding = 0;
};

// ---------------------------------------------------------------------------
// BlockPool

BlockPool::Block BlockPool::Acquire(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity >= bytes) {
        Block block = std::move(free_[i]);
        free_[i] = std::move(free_.back());
        free_.pop_back();
        return block;
      }
    }
  }
  Block block;
  block.capacity = std::max<size_t>(bytes, 1);
  block.data.reset(new char[block.capacity]);  // Uninitialised: it is overwritten by a receive.
  return block;
}

void BlockPool::Release(Block block) {
  if (!block.data) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.size() < kMaxPooledBlocks) free_.push_back(std::move(block));
}

// ---------------------------------------------------------------------------
// Server

Server::Server(ServerOptions options) : options_(options) {}

Server::~Server() { Stop(); }

Status Server::Listen(int* bound_port) {
  if (::pipe2(failure_pipe_, O_CLOEXEC) != 0)
    return Status::Error(std::string("pipe() failed: ") + std::strerror(errno));
  Status status = ListenTcp(options_.port, &listen_fd_, bound_port);
  if (!status.ok()) return status;
  status = ListenLocal(*bound_port, &local_listen_fd_);
  if (!status.ok()) BPS_LOG(kWarning) << status.message() << "; local workers will use TCP";
  return Status::OK();
}

Status Server::Serve(int num_workers) {
  if (num_workers < 1 || !engines_.empty()) return Status::Error("the server is already serving");
  num_workers_ = num_workers;
  finished_.assign(num_workers_, false);
  conns_.resize(num_workers_);
  for (int i = 0; i < std::max(1, options_.engine_threads); ++i) {
    engines_.push_back(std::make_unique<Engine>());
    Engine* engine = engines_.back().get();
    engine->thread = std::thread([this, engine] { EngineLoop(engine); });
  }
  acceptor_ = std::thread([this] { AcceptLoop(); });
  BPS_LOG(kInfo) << "server serving " << num_workers_ << " worker(s) with " << engines_.size()
                 << " engine thread(s)";
  return Status::OK();
}

void Server::AcceptLoop() {
  pollfd listeners[2] = {{listen_fd_, POLLIN, 0}, {local_listen_fd_, POLLIN, 0}};
  const nfds_t count = local_listen_fd_ >= 0 ? 2 : 1;
  while (!stopping_) {
    if (::poll(listeners, count, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (nfds_t i = 0; i < count; ++i) {
      if (listeners[i].revents & (POLLERR | POLLHUP | POLLNVAL)) return;  // Stop() closed it.
      if (!(listeners[i].revents & POLLIN)) continue;
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(listeners[i].fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ConfigureSocket(fd, options_.timeout_ms);
      std::string peer = "a worker on this host";
      const bool local = addr.ss_family == AF_UNIX;
      if (addr.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
        char host[INET_ADDRSTRLEN] = {0};
        ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        peer = std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
      }
      auto conn = std::make_shared<WorkerConn>(std::make_unique<Connection>(fd, peer), local);
      std::lock_guard<std::mutex> lock(conns_mutex_);
      accepted_.push_back(conn);
      readers_.emplace_back([this, conn] { ReadLoop(conn); });
    }
  }
}

void Server::ReadLoop(std::shared_ptr<WorkerConn> worker) {
  Connection& conn = *worker->conn;
  FrameHeader header;
  bool eof = false;
  Status status = conn.ReceiveHeader(&header, &eof);
  if (!status.ok() || header.type != static_cast<uint8_t>(FrameType::kHello) ||
      header.rank >= static_cast<uint32_t>(num_workers_)) {
    BPS_LOG(kWarning) << "dropping connection from " << conn.peer()
                      << ": it did not introduce itself as a worker of this job";
    return;
  }
  const uint32_t rank = header.rank;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    if (conns_[rank]) {
      SetFailure("two workers claim rank " + std::to_string(rank) + " (" +
                 conns_[rank]->conn->peer() + " and " + conn.peer() + ")");
      return;
    }
    worker->rank = static_cast<int>(rank);
    conns_[rank] = worker;
  }
  BPS_LOG(kDebug) << "worker rank " << rank << " connected from " << conn.peer();

  while (true) {
    status = conn.ReceiveHeader(&header, &eof);
    if (!status.ok()) break;
    const auto type = static_cast<FrameType>(header.type);
    if (type == FrameType::kBye) {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      finished_[rank] = true;
      ++finished_count_;
      BPS_LOG(kDebug) << "worker rank " << rank << " finished";
      return;
    }
    if (type == FrameType::kDeclare) {
      std::string payload(header.length, '\0');
      status = conn.ReceivePayload(payload.data(), payload.size());
      if (!status.ok()) break;
      Declaration declaration;
      if (!DecodeDeclaration(payload, &declaration)) {
        status = Status::Error("malformed tensor declaration from worker rank " +
                               std::to_string(rank));
        break;
      }
      std::lock_guard<std::mutex> lock(declarations_mutex_);
      declarations_[{header.tensor_id, rank}] = std::move(declaration);
      continue;
    }
    if (type == FrameType::kArena && worker->local &&
        header.length == sizeof(ArenaAnnouncement)) {
      ArenaAnnouncement announcement;
      const int fd = conn.TakeReceivedFd();
      status = conn.ReceivePayload(&announcement, sizeof(announcement));
      if (status.ok() && fd < 0) status = Status::Error("an arena came without its descriptor");
      if (status.ok()) {
        status = worker->arenas.Add(announcement.index, fd, announcement.size);  // Owns fd.
      } else if (fd >= 0) {
        ::close(fd);
      }
      if (!status.ok()) break;
      continue;
    }
    if ((type != FrameType::kPush && type != FrameType::kPushShm) ||
        !IsValidDataType(header.dtype)) {
      status = Status::Error("unexpected frame type " + std::to_string(header.type) +
                             " from worker rank " + std::to_string(rank));
      break;
    }
    {
      std::unique_lock<std::mutex> lock(worker->mutex);
      worker->cv.wait(lock, [&] { return worker->outstanding < kMaxOutstandingPerWorker; });
      ++worker->outstanding;
    }
    PushItem item;
    status = ReceivePush(worker.get(), header, &item);
    if (!status.ok()) break;
    item.rank = rank;  // The connection's rank, whatever the frame claims.
    const PartitionKey key{item.tensor_id, item.part};
    Engine* engine = engines_[PartitionKeyHash()(key) % engines_.size()].get();
    {
      std::lock_guard<std::mutex> lock(engine->mutex);
      engine->queue.push_back(std::move(item));
    }
    engine->cv.notify_one();
  }
  if (!stopping_) {
    SetFailure("worker rank " + std::to_string(rank) + " (" + conn.peer() +
               ") disconnected without shutting down: " + status.message());
  }
}

Status Server::ReceivePush(WorkerConn* worker, const FrameHeader& header, PushItem* item) {
  item->tensor_id = header.tensor_id;
  item->part = header.part;
  item->dtype = header.dtype;
  item->signature = header.signature;
  if (static_cast<FrameType>(header.type) == FrameType::kPush) {
    item->length = header.length;
    item->block = pool_.Acquire(header.length);
    return worker->conn->ReceivePayload(item->block.data.get(), item->length);
  }
  ShmLocation location;
  if (header.length != sizeof(location) || !worker->local)
    return Status::Error("malformed shared-memory push");
  Status status = worker->conn->ReceivePayload(&location, sizeof(location));
  if (!status.ok()) return status;
  item->length = location.length;
  item->shared = worker->arenas.Resolve(location);
  if (!item->shared) return Status::Error("a shared-memory push points outside the worker's arenas");
  return Status::OK();
}

void Server::EngineLoop(Engine* engine) {
  while (true) {
    PushItem item;
    {
      std::unique_lock<std::mutex> lock(engine->mutex);
      engine->cv.wait(lock, [&] { return stopping_ || !engine->queue.empty(); });
      if (stopping_) return;
      item = std::move(engine->queue.front());
      engine->queue.pop_front();
    }
    if (item.fail_rounds) {
      FailRounds(engine, failure());
      continue;
    }
    const uint32_t rank = item.rank;
    Process(engine, std::move(item));
    std::shared_ptr<WorkerConn> worker;
    {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      worker = conns_[rank];
    }
    {
      std::lock_guard<std::mutex> lock(worker->mutex);
      --worker->outstanding;
    }
    worker->cv.notify_one();
  }
}

void Server::Process(Engine* engine, PushItem item) {
  if (failed_.load()) {
    const std::string fatal = failure();
    SendError(item.rank, item.tensor_id, item.part,
              "the job is failing: " + fatal + " (tensor " + Describe(item.tensor_id, item.rank) +
                  ")");
    pool_.Release(std::move(item.block));
    return;
  }
  const PartitionKey id{item.tensor_id, item.part};
  KeyState& key = engine->keys[id];
  if (key.contributors.empty()) {
    if (item.shared) {
      key.shared.push_back(item.shared);
    } else {
      key.sum = std::move(item.block);
    }
    key.length = item.length;
    key.signature = item.signature;
    key.dtype = item.dtype;
    key.error.clear();
  } else {
    const bool repeated = std::find(key.contributors.begin(), key.contributors.end(),
                                    item.rank) != key.contributors.end();
    if (key.error.empty() && repeated) {
      key.error = "worker rank " + std::to_string(item.rank) + " pushed partition " +
                  std::to_string(item.part) + " of tensor " + Describe(item.tensor_id, item.rank) +
                  " twice in one round";
    } else if (key.error.empty() &&
               (item.signature != key.signature || item.length != key.length)) {
      key.error = MismatchMessage(item.tensor_id, key.contributors.front(), item.rank);
      for (uint32_t earlier : key.contributors)
        SendError(earlier, item.tensor_id, item.part, key.error);
    }
    if (key.error.empty()) {
      if (item.shared) {
        key.shared.push_back(item.shared);
      } else if (!key.sum.data) {
        key.sum = std::move(item.block);
      } else {
        SumInto(static_cast<DataType>(key.dtype), key.sum.data.get(), item.block.data.get(),
                key.length / DataTypeSize(static_cast<DataType>(key.dtype)));
      }
    }
    pool_.Release(std::move(item.block));
  }
  key.contributors.push_back(item.rank);
  if (!key.error.empty()) SendError(item.rank, item.tensor_id, item.part, key.error);

  // A rank that already said Bye can never complete this round.
  std::vector<uint32_t> gone;
  if (finished_count_.load() > 0) {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (int r = 0; r < num_workers_; ++r) {
      if (finished_[r] && std::find(key.contributors.begin(), key.contributors.end(),
                                    static_cast<uint32_t>(r)) == key.contributors.end())
        gone.push_back(static_cast<uint32_t>(r));
    }
  }
  if (!gone.empty() && key.error.empty()) {
    key.error = "worker rank " + std::to_string(gone.front()) +
                " has already shut down, so tensor " + Describe(item.tensor_id, item.rank) +
                " cannot be summed";
    for (uint32_t r : key.contributors) SendError(r, item.tensor_id, item.part, key.error);
  }

  if (key.contributors.size() + gone.size() < static_cast<size_t>(num_workers_) &&
      gone.empty())
    return;
  if (key.error.empty()) {
    ShmLocation slot;
    const char* sum = Complete(engine, id, &key, &slot);
    if (!sum) {
      for (uint32_t r : key.contributors)
        SendError(r, id.tensor_id, id.part, "the server ran out of shared memory: " + failure());
    }
    for (uint32_t r : key.contributors)
      if (sum) SendReply(r, id.tensor_id, id.part, sum, key.length, key.shared.empty() ? nullptr : &slot);
  }
  pool_.Release(std::move(key.sum));
  engine->keys.erase(id);
}

const char* Server::Complete(Engine* engine, const PartitionKey& id, KeyState* key,
                             ShmLocation* slot) {
  if (key->shared.empty()) return key->sum.data.get();  // Summed as the pushes came in.
  auto found = engine->result_slots.find(id);
  char* out = nullptr;
  {
    std::lock_guard<std::mutex> lock(results_mutex_);
    if (found == engine->result_slots.end() || found->second.length != key->length) {
      bool fresh_arena = false;
      Status status = results_.Allocate(key->length, slot, &fresh_arena);
      if (!status.ok()) {
        SetFailure(status.message());
        return nullptr;
      }
      found = engine->result_slots.insert_or_assign(id, *slot).first;
    }
    *slot = found->second;
    out = results_.Resolve(*slot);
  }
  const auto dtype = static_cast<DataType>(key->dtype);
  const size_t count = key->length / DataTypeSize(dtype);
  // Shared inputs are read once each: the first pair lands in the result directly.
  std::vector<const char*> inputs = key->shared;
  if (key->sum.data) inputs.insert(inputs.begin(), key->sum.data.get());
  if (inputs.size() == 1) {
    std::memcpy(out, inputs[0], key->length);
  } else {
    SumOf(dtype, out, inputs[0], inputs[1], count);
    for (size_t i = 2; i < inputs.size(); ++i) SumInto(dtype, out, inputs[i], count);
  }
  return out;
}

void Server::SendToWorker(uint32_t rank, FrameType type, uint64_t tensor_id, uint32_t part,
                          const void* payload, size_t length) {
  std::shared_ptr<WorkerConn> worker;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    worker = conns_[rank];
  }
  if (!worker) return;
  FrameHeader header;
  header.type = static_cast<uint8_t>(type);
  header.tensor_id = tensor_id;
  header.part = part;
  header.length = length;
  std::lock_guard<std::mutex> lock(worker->conn->write_mutex());
  // A failed send needs no handling here: that worker's reader sees the broken
  // connection and fails the job with the reason.
  Status status = worker->conn->Send(header, payload);
  if (!status.ok()) BPS_LOG(kDebug) << status.message();
}

void Server::SendReply(uint32_t rank, uint64_t tensor_id, uint32_t part, const void* data,
                       size_t length, const ShmLocation* slot) {
  std::shared_ptr<WorkerConn> worker;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    worker = conns_[rank];
  }
  if (!worker || !slot || !worker->local) {
    SendToWorker(rank, FrameType::kReply, tensor_id, part, data, length);
    return;
  }
  // A same-host worker reads the sum from the result slot; first it must have every
  // arena up to the slot's.
  std::lock_guard<std::mutex> lock(worker->conn->write_mutex());
  Status status = Status::OK();
  while (status.ok() && worker->announced_results <= slot->arena) {
    ArenaAnnouncement announcement;
    int fd;
    {
      std::lock_guard<std::mutex> results_lock(results_mutex_);
      const SharedArena& arena = results_.arena(worker->announced_results);
      announcement = ArenaAnnouncement{worker->announced_results, 0, arena.size()};
      fd = arena.fd();
    }
    FrameHeader header;
    header.type = static_cast<uint8_t>(FrameType::kArena);
    header.length = sizeof(announcement);
    status = worker->conn->Send(header, &announcement, fd);
    ++worker->announced_results;
  }
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kReplyShm);
  header.tensor_id = tensor_id;
  header.part = part;
  header.length = sizeof(*slot);
  if (status.ok()) status = worker->conn->Send(header, slot);
  if (!status.ok()) BPS_LOG(kDebug) << status.message();
}

void Server::SendError(uint32_t rank, uint64_t tensor_id, uint32_t part,
                       const std::string& message) {
  SendToWorker(rank, FrameType::kError, tensor_id, part, message.data(), message.size());
}

std::string Server::Describe(uint64_t tensor_id, uint32_t rank) {
  std::lock_guard<std::mutex> lock(declarations_mutex_);
  auto it = declarations_.find({tensor_id, rank});
  if (it == declarations_.end()) return "with id " + std::to_string(tensor_id);
  return "'" + it->second.name + "'";
}

std::string Server::MismatchMessage(uint64_t tensor_id, uint32_t rank_a, uint32_t rank_b) {
  std::lock_guard<std::mutex> lock(declarations_mutex_);
  auto a = declarations_.find({tensor_id, rank_a});
  auto b = declarations_.find({tensor_id, rank_b});
  if (a == declarations_.end() || b == declarations_.end())
    return "workers pushed tensor id " + std::to_string(tensor_id) + " with different sizes";
  return "tensor '" + a->second.name + "' has different shapes or dtypes across workers: rank " +
         std::to_string(rank_a) + " has " + ShapeString(a->second.dtype, a->second.shape) +
         ", rank " + std::to_string(rank_b) + " has " +
         ShapeString(b->second.dtype, b->second.shape);
}

void Server::SetFailure(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failure_.empty()) return;
    failure_ = reason;
  }
  failed_.store(true);
  BPS_LOG(kError) << reason;
  char byte = 1;
  if (::write(failure_pipe_[1], &byte, 1) < 0) BPS_LOG(kWarning) << "cannot signal failure";
  // Rounds that wait for the lost worker can never finish. Their state belongs to
  // the engine threads, so ask each engine to fail its own.
  for (auto& engine : engines_) {
    PushItem item;
    item.fail_rounds = true;
    {
      std::lock_guard<std::mutex> lock(engine->mutex);
      engine->queue.push_front(std::move(item));
    }
    engine->cv.notify_one();
  }
}

void Server::FailRounds(Engine* engine, const std::string& reason) {
  for (auto& [id, key] : engine->keys) {
    for (uint32_t rank : key.contributors) {
      SendError(rank, id.tensor_id, id.part,
                "the job is failing: " + reason + " (tensor " + Describe(id.tensor_id, rank) + ")");
    }
    pool_.Release(std::move(key.sum));
  }
  engine->keys.clear();
}

std::string Server::failure() {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

void Server::Stop() {
  if (stopping_.exchange(true)) return;
  for (int fd : {listen_fd_, local_listen_fd_})
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  for (int fd : {listen_fd_, local_listen_fd_})
    if (fd >= 0) ::close(fd);
  std::vector<std::thread> readers;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (auto& worker : accepted_) worker->conn->Shutdown();
    readers.swap(readers_);
  }
  for (auto& engine : engines_) {
    {
      std::lock_guard<std::mutex> lock(engine->mutex);
    }
    engine->cv.notify_all();
    if (engine->thread.joinable()) engine->thread.join();
  }
  for (auto& worker : accepted_) {
    std::lock_guard<std::mutex> lock(worker->mutex);
    worker->outstanding = 0;
    worker->cv.notify_all();
  }
  for (auto& reader : readers) reader.join();
  for (int fd : failure_pipe_)
    if (fd >= 0) ::close(fd);
}

}  // namespace bps
