#include "server.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "../common/logging.h"
#include "../common/reduce.h"
#include "../wire/auth.h"

namespace bps {
namespace {

// Items a reader may hand to the engines before it stops reading from its worker;
// bounds server memory to the sum buffers plus this many blocks per worker.
constexpr int kMaxOutstandingPerWorker = 16;
constexpr size_t kMaxPooledBlocks = 64;
constexpr uint64_t kMaxDeclarationBytes = 1 << 20;
// A connection has this long to say which worker it is, and only so many may be
// waiting to, so that strangers cannot hold threads and descriptors.
constexpr int kHelloTimeoutMs = 10000;
constexpr size_t kMaxUnintroduced = 64;

}  // namespace

struct Server::WorkerConn {
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
  return listener_.Listen(options_.host, options_.port, options_.timeout_ms, bound_port);
}

Status Server::Serve(const std::vector<int32_t>& host_of_rank) {
  if (host_of_rank.empty() || !engines_.empty())
    return Status::Error("the server is already serving");
  num_workers_ = static_cast<int>(host_of_rank.size());
  host_ranks_.assign(num_workers_, {});
  for (int r = 0; r < num_workers_; ++r)
    for (int q = 0; q < num_workers_; ++q)
      if (host_of_rank[q] == host_of_rank[r]) host_ranks_[r].push_back(static_cast<uint32_t>(q));
  finished_.assign(num_workers_, false);
  joined_.assign(num_workers_, false);
  conns_.resize(num_workers_);
  for (int r = 0; r < num_workers_; ++r) all_ranks_.push_back(static_cast<uint32_t>(r));
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
  while (!stopping_) {
    std::unique_ptr<Channel> channel;
    if (!listener_.Accept(&channel).ok()) return;  // Stop() closed it.
    auto conn = std::make_shared<WorkerConn>(std::move(channel));
    std::lock_guard<std::mutex> lock(conns_mutex_);
    if (!ReapReaders()) {
      BPS_LOG(kWarning) << "refusing a connection from " << conn->channel->peer() << ": "
                        << kMaxUnintroduced << " others have not said who they are yet";
      continue;  // Closes it.
    }
    readers_.push_back(Reader{conn, std::thread([this, conn] {
                                ReadLoop(conn);
                                std::lock_guard<std::mutex> lock(conns_mutex_);
                                // A stranger's descriptor goes at once; a worker's stays
                                // in conns_ for the replies still being sent.
                                if (conn->rank < 0) conn->channel.reset();
                                conn->finished = true;
                              })});
  }
}

bool Server::ReapReaders() {
  size_t unintroduced = 0;
  for (auto it = readers_.begin(); it != readers_.end();) {
    if (it->conn->finished) {
      it->thread.join();
      it = readers_.erase(it);  // A worker's connection lives on in conns_.
    } else {
      unintroduced += it->conn->rank < 0;
      ++it;
    }
  }
  return unintroduced < kMaxUnintroduced;
}

void Server::ReadLoop(std::shared_ptr<WorkerConn> worker) {
  Channel& conn = *worker->channel;
  FrameHeader header;
  DataReader payload;
  bool eof = false;
  uint32_t rank = 0;
  Status status = AuthenticateWorker(conn, options_.token, num_workers_, kHelloTimeoutMs, &rank);
  if (!status.ok()) {
    BPS_LOG(kWarning) << "dropping connection from " << conn.peer() << ": " << status.message();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    if (conns_[rank]) {
      // The scheduler gives each rank to one worker: this is not one of the job's.
      BPS_LOG(kWarning) << "dropping connection from " << conn.peer() << ": it claims rank " << rank
                        << ", which " << conns_[rank]->channel->peer() << " holds";
      return;
    }
    worker->rank = static_cast<int>(rank);
    conns_[rank] = worker;
  }
  BPS_LOG(kDebug) << "worker rank " << rank << " connected from " << conn.peer();

  while (true) {
    status = conn.Receive(&header, &payload, &eof);
    if (!status.ok()) break;
    const auto type = static_cast<FrameType>(header.type);
    if (type == FrameType::kBye) {
      {
        std::lock_guard<std::mutex> lock(conns_mutex_);
        finished_[rank] = true;
        ++finished_count_;
      }
      BPS_LOG(kDebug) << "worker rank " << rank << " finished";
      // Its memory goes once every engine has passed what it pushed before.
      worker->forgetting = static_cast<int>(engines_.size());
      EnqueueEverywhere(PushItem::Kind::kForget, rank);
      return;
    }
    if (type == FrameType::kDeclare) {
      if (header.length > kMaxDeclarationBytes) {
        status = Status::Error("an oversized tensor declaration");
        break;
      }
      std::string text(header.length, '\0');
      status = payload.Read(text.data(), text.size());
      if (!status.ok()) break;
      Declaration declaration;
      if (!DecodeDeclaration(text, &declaration)) {
        status =
            Status::Error("malformed tensor declaration from worker rank " + std::to_string(rank));
        break;
      }
      if (DeclaredBytes(declaration) > options_.max_tensor_bytes) {
        status = Status::Error(
            "worker rank " + std::to_string(rank) + " declared tensor '" + declaration.name +
            "' of " + bps::Describe(declaration) +
            ", more than BYTEPS_MAX_TENSOR_BYTES=" + std::to_string(options_.max_tensor_bytes));
        break;
      }
      std::lock_guard<std::mutex> lock(declarations_mutex_);
      declarations_[{header.tensor_id, rank}] = std::move(declaration);
      continue;
    }
    if (type == FrameType::kJoin && header.length == 0) {
      OnJoin(rank);
      continue;
    }
    if (type == FrameType::kProcessSet) {
      status = ReceiveProcessSet(header, &payload);
      if (!status.ok()) break;
      continue;
    }
    const bool push = type == FrameType::kPush;
    if ((!push && type != FrameType::kAbandon) || !IsValidOpKind(header.op_kind) ||
        (push && (!IsValidDataType(header.dtype) || !IsValidReduceOp(header.reduce_op))) ||
        header.owner < -1 || header.owner >= num_workers_ ||
        (type == FrameType::kAbandon && header.length != 0)) {
      status = Status::Error("unexpected frame (type " + std::to_string(header.type) +
                             ") from worker rank " + std::to_string(rank));
      break;
    }
    if (type == FrameType::kAbandon) {
      PushItem item;
      item.kind_of_item = PushItem::Kind::kAbandon;
      item.kind = static_cast<OpKind>(header.op_kind);
      item.tensor_id = header.tensor_id;
      item.part = header.part;
      item.round = header.round;
      item.rank = rank;
      Enqueue(std::move(item));
      continue;
    }
    status = CheckPushLength(header, rank);
    if (!status.ok()) break;
    {
      std::unique_lock<std::mutex> lock(worker->mutex);
      worker->cv.wait(lock, [&] { return worker->outstanding < kMaxOutstandingPerWorker; });
      ++worker->outstanding;
    }
    PushItem item;
    status = ReceivePush(header, &payload, &item);
    if (!status.ok()) break;
    item.rank = rank;  // The connection's rank, whatever the frame claims.
    Enqueue(std::move(item));
  }
  if (!stopping_) {
    SetFailure("worker rank " + std::to_string(rank) + " (" + conn.peer() +
               ") disconnected without shutting down: " + status.message());
  }
}

Status Server::ReceiveProcessSet(const FrameHeader& header, DataReader* payload) {
  const size_t count = header.length / sizeof(int32_t);
  if (header.process_set == 0 || header.length % sizeof(int32_t) != 0 ||
      count > static_cast<size_t>(num_workers_))
    return Status::Error("a malformed process set");
  std::vector<int32_t> ranks(count);
  Status status = payload->Read(ranks.data(), header.length);
  if (!status.ok()) return status;
  std::vector<uint32_t> members;
  for (int32_t r : ranks) {
    if (r < 0 || r >= num_workers_ ||
        (!members.empty() && static_cast<uint32_t>(r) <= members.back()))
      return Status::Error("a process set with invalid or unordered ranks");
    members.push_back(static_cast<uint32_t>(r));
  }
  // A removal (no ranks) changes nothing here: a set is only used by the pushes that
  // name it, and an id is registered again before it is reused.
  if (members.empty()) return Status::OK();
  std::lock_guard<std::mutex> lock(process_sets_mutex_);
  process_sets_[header.process_set] = std::move(members);
  return Status::OK();
}

bool Server::MembersOf(uint32_t process_set, std::vector<uint32_t>* members) {
  if (process_set == 0) {
    *members = all_ranks_;
    return true;
  }
  std::lock_guard<std::mutex> lock(process_sets_mutex_);
  auto found = process_sets_.find(process_set);
  if (found == process_sets_.end()) return false;
  *members = found->second;
  return true;
}

void Server::Enqueue(PushItem item) {
  // A key always goes to the same engine, so its state needs no lock.
  const PartitionKey key{item.tensor_id, item.part};
  Engine* engine = engines_[PartitionKeyHash()(key) % engines_.size()].get();
  {
    std::lock_guard<std::mutex> lock(engine->mutex);
    engine->queue.push_back(std::move(item));
  }
  engine->cv.notify_one();
}

Status Server::ReceivePush(const FrameHeader& header, DataReader* payload, PushItem* item) {
  item->tensor_id = header.tensor_id;
  item->part = header.part;
  item->round = header.round;
  item->kind = static_cast<OpKind>(header.op_kind);
  item->dtype = header.dtype;
  item->reduce_op = static_cast<ReduceOp>(header.reduce_op);
  item->signature = header.signature;
  item->rows = header.rows;
  item->owner = header.owner;
  item->process_set = header.process_set;
  item->host_merged = (header.flags & kFlagHostMerged) != 0;
  item->length = header.length;
  // Data in shared memory is used where it lies; from a socket it lands in a block.
  item->shared = payload->View(item->length);
  if (item->shared) return Status::OK();
  try {
    item->block = pool_.Acquire(item->length);
  } catch (const std::bad_alloc&) {
    return Status::Error("no memory for a push of " + std::to_string(item->length) + " bytes");
  }
  return payload->Read(item->block.data.get(), item->length);
}

Status Server::CheckPushLength(const FrameHeader& header, uint32_t rank) {
  // A gather's first step carries at most every worker's split.
  uint64_t limit = AllgatherTableBytes(num_workers_);
  {
    std::lock_guard<std::mutex> lock(declarations_mutex_);
    auto found = declarations_.find({header.tensor_id, rank});
    if (found != declarations_.end()) limit = std::max(limit, DeclaredBytes(found->second));
  }
  if (header.length <= limit) return Status::OK();
  return Status::Error("worker rank " + std::to_string(rank) + " pushed " +
                       std::to_string(header.length) + " bytes of tensor " +
                       Describe(header.tensor_id, rank) + ", more than the " +
                       std::to_string(limit) + " it declared");
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
    switch (item.kind_of_item) {
      case PushItem::Kind::kFailRounds:
        FailRounds(engine, failure());
        continue;
      case PushItem::Kind::kAbandon:  // Not counted as outstanding: it carries no data.
        Process(engine, std::move(item));
        continue;
      case PushItem::Kind::kJoined:
        for (auto& [id, key] : engine->keys)
          if (key.active) MaybeComplete(id, &key);
        continue;
      case PushItem::Kind::kJoinReport:
        ReportRounds(engine);
        continue;
      case PushItem::Kind::kForget:
        Forget(engine, item.rank);
        continue;
      case PushItem::Kind::kPush:
        break;
    }
    const uint32_t rank = item.rank;
    Process(engine, std::move(item));
    std::shared_ptr<WorkerConn> worker = ConnOf(rank);
    {
      std::lock_guard<std::mutex> lock(worker->mutex);
      --worker->outstanding;
    }
    worker->cv.notify_one();
  }
}

void Server::Process(Engine* engine, PushItem item) {
  const PartitionKey id{item.tensor_id, item.part};
  if (failed_.load()) {
    SendError(item.rank, id, item.round, ErrorKind::kPeerGone,
              "the job is failing: " + failure() + " (tensor " +
                  Describe(item.tensor_id, item.rank) + ")");
    pool_.Release(std::move(item.block));
    return;
  }
  KeyState& key = engine->keys[id];
  if (item.kind_of_item == PushItem::Kind::kAbandon) {
    Abandon(id, &key, item);
    return;
  }
  if (item.kind == OpKind::kAsyncPushPull || key.asynchronous) {
    ProcessAsync(id, &key, &item);
    return;
  }
  const std::string round_text = "round " + std::to_string(item.round);
  if (item.round == key.last_closed && !key.closed_error.empty()) {
    // A late contributor to a round that failed hears the same reason as the others.
    SendError(item.rank, id, item.round, key.closed_kind, key.closed_error);
    pool_.Release(std::move(item.block));
    return;
  }
  if (item.round <= key.last_closed) {
    SendError(item.rank, id, item.round, ErrorKind::kAborted,
              "worker rank " + std::to_string(item.rank) + " sent " + round_text + " of tensor " +
                  Describe(item.tensor_id, item.rank) + " after round " +
                  std::to_string(key.last_closed) + " had ended" +
                  (key.closed_error.empty() ? "" : " (" + key.closed_error + ")") +
                  "; it is refused so that no stale value reaches another round");
    pool_.Release(std::move(item.block));
    return;
  }
  if (key.active && item.round != key.round) {
    const uint32_t newest = std::max(item.round, key.round);
    FailRound(id, &key, ErrorKind::kAborted,
              "workers are out of step on tensor " + Describe(item.tensor_id, item.rank) +
                  ": worker rank " + std::to_string(key.contributors.front()) + " sent round " +
                  std::to_string(key.round) + ", worker rank " + std::to_string(item.rank) +
                  " sent " + round_text + " (an earlier operation on it failed on some worker)",
              &item);
    key.last_closed = newest;
    pool_.Release(std::move(item.block));
    return;
  }
  if (!key.active) {
    std::string refusal;
    if (!MembersOf(item.process_set, &key.members)) {
      refusal = "process set " + std::to_string(item.process_set) + " is not registered here";
    } else if (!std::binary_search(key.members.begin(), key.members.end(), item.rank)) {
      refusal = "worker rank " + std::to_string(item.rank) + " is not a member of process set " +
                std::to_string(item.process_set);
    }
    if (!refusal.empty()) {
      SendError(item.rank, id, item.round, ErrorKind::kInvalidArgument,
                refusal + " (tensor " + Describe(item.tensor_id, item.rank) + ")");
      pool_.Release(std::move(item.block));
      return;
    }
    key.active = true;
    key.process_set = item.process_set;
    key.round = item.round;
    key.kind = item.kind;
    key.dtype = item.dtype;
    key.reduce_op = item.reduce_op;
    key.signature = item.signature;
    key.length = item.length;
    key.by_rank.clear();
    key.owner = item.owner;
    if (!IsReduction(item.kind)) key.by_rank.resize(num_workers_);
  }
  // A host's merged push counts for each of its workers (the leader summed them).
  if (item.host_merged && (item.kind != OpKind::kPushPull || item.process_set != 0)) {
    FailRound(id, &key, ErrorKind::kInternal,
              "worker rank " + std::to_string(item.rank) + " sent a host-merged " +
                  OpKindName(item.kind) + " of tensor " + Describe(item.tensor_id, item.rank) +
                  " (only push_pull in the global set merges)",
              &item);
    pool_.Release(std::move(item.block));
    return;
  }
  const std::vector<uint32_t> single{item.rank};
  const std::vector<uint32_t>& counts_for = item.host_merged ? host_ranks_[item.rank] : single;
  for (uint32_t r : counts_for) {
    if (std::find(key.covered.begin(), key.covered.end(), r) == key.covered.end()) continue;
    FailRound(id, &key, ErrorKind::kInternal,
              "partition " + std::to_string(item.part) + " of tensor " +
                  Describe(item.tensor_id, item.rank) + " arrived twice for worker rank " +
                  std::to_string(r) + " in " + round_text + " (the last from worker rank " +
                  std::to_string(item.rank) + ")",
              &item);
    pool_.Release(std::move(item.block));
    return;
  }
  const bool same_length = !IsReduction(item.kind) || item.length == key.length;
  if (item.signature != key.signature || item.kind != key.kind || item.dtype != key.dtype ||
      item.owner != key.owner || item.process_set != key.process_set || !same_length ||
      !std::binary_search(key.members.begin(), key.members.end(), item.rank)) {
    FailRound(id, &key, ErrorKind::kMismatch,
              MismatchMessage(item.tensor_id, key.contributors.front(), item.rank), &item);
    pool_.Release(std::move(item.block));
    return;
  }
  key.bytes_in += item.length;
  Accumulate(&key, &item);
  key.contributors.push_back(item.rank);
  key.covered.insert(key.covered.end(), counts_for.begin(), counts_for.end());

  // A rank that already said Bye can never complete this round.
  int gone = -1;
  if (finished_count_.load() > 0) {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (uint32_t r : key.members) {
      if (finished_[r] &&
          std::find(key.covered.begin(), key.covered.end(), r) == key.covered.end()) {
        gone = static_cast<int>(r);
        break;
      }
    }
  }
  if (gone >= 0) {
    FailRound(id, &key, ErrorKind::kPeerGone,
              "worker rank " + std::to_string(gone) + " has already shut down, so tensor " +
                  Describe(item.tensor_id, item.rank) + " cannot complete");
    return;
  }
  MaybeComplete(id, &key);
}

bool Server::MaybeComplete(const PartitionKey& id, KeyState* key) {
  // Members that joined take part with nothing: no contribution, no rows.
  size_t present = key->covered.size();
  if (joined_any_.load() > 0) {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (uint32_t r : key->members)
      if (joined_[r] &&
          std::find(key->covered.begin(), key->covered.end(), r) == key->covered.end())
        ++present;
  }
  if (present < key->members.size()) return false;
  if (key->kind == OpKind::kBroadcast &&
      std::none_of(key->contributors.begin(), key->contributors.end(),
                   [&](uint32_t r) { return key->by_rank[r].length > 0; })) {
    FailRound(id, key, ErrorKind::kInvalidArgument,
              "the root of broadcast " + Describe(id.tensor_id, key->contributors.front()) +
                  " has joined (bps.join) and sends nothing");
    return true;
  }
  size_t length = 0;
  const char* result = Complete(id, key, &length);
  if (!result) {
    FailRound(id, key, ErrorKind::kInternal, "the server ran out of shared memory: " + failure());
    return true;
  }
  key->bytes_out += length * Reply(id, *key, result, length);
  key->closed_error.clear();
  key->last_closed = key->round;
  CloseRound(key);
  return true;
}

void Server::OnJoin(uint32_t rank) {
  bool everyone = false;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    if (!joined_[rank]) {
      joined_[rank] = true;
      ++joined_count_;
    }
    last_joined_ = static_cast<int>(rank);
    everyone = joined_count_ == num_workers_;
  }
  joined_any_.store(1);
  EnqueueEverywhere(PushItem::Kind::kJoined);
  if (!everyone) return;
  {
    std::lock_guard<std::mutex> lock(join_report_mutex_);
    join_reports_pending_ = static_cast<int>(engines_.size());
    join_rounds_.clear();
  }
  EnqueueEverywhere(PushItem::Kind::kJoinReport);
}

void Server::ReportRounds(Engine* engine) {
  std::vector<std::pair<uint64_t, uint32_t>> rounds;
  for (const auto& [id, key] : engine->keys)
    rounds.emplace_back(id.tensor_id, std::max(key.last_closed, key.active ? key.round : 0));
  std::lock_guard<std::mutex> lock(join_report_mutex_);
  join_rounds_.insert(join_rounds_.end(), rounds.begin(), rounds.end());
  if (--join_reports_pending_ > 0) return;
  // The last engine to report answers every worker's join, and the next join starts
  // from nobody.
  int32_t last;
  {
    std::lock_guard<std::mutex> conns_lock(conns_mutex_);
    last = last_joined_;
    joined_.assign(num_workers_, false);
    joined_count_ = 0;
  }
  joined_any_.store(0);
  std::string payload(reinterpret_cast<const char*>(&last), sizeof(last));
  for (const auto& [tensor_id, round] : join_rounds_) {
    payload.append(reinterpret_cast<const char*>(&tensor_id), sizeof(tensor_id));
    payload.append(reinterpret_cast<const char*>(&round), sizeof(round));
  }
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kJoined);
  header.length = payload.size();
  for (int r = 0; r < num_workers_; ++r)
    SendToWorker(static_cast<uint32_t>(r), header, payload.data());
}

void Server::EnqueueEverywhere(PushItem::Kind kind, uint32_t rank) {
  for (auto& engine : engines_) {
    PushItem item;
    item.kind_of_item = kind;
    item.rank = rank;
    {
      std::lock_guard<std::mutex> lock(engine->mutex);
      engine->queue.push_back(std::move(item));
    }
    engine->cv.notify_one();
  }
}

void Server::ProcessAsync(const PartitionKey& id, KeyState* key, PushItem* item) {
  const uint32_t rank = item->rank;
  auto refuse = [&](ErrorKind kind, const std::string& why) {
    SendError(rank, id, item->round, kind, why);
    pool_.Release(std::move(item->block));
  };
  const std::string tensor = "tensor " + Describe(item->tensor_id, rank);
  if (item->kind != OpKind::kAsyncPushPull)
    return refuse(ErrorKind::kMismatch, "worker rank " + std::to_string(rank) + " sent a " +
                                            OpKindName(item->kind) + " of " + tensor +
                                            ", which other workers train asynchronously "
                                            "(BYTEPS_ENABLE_ASYNC=1)");
  if (!options_.enable_async)
    return refuse(ErrorKind::kInvalidArgument,
                  "worker rank " + std::to_string(rank) + " trains " + tensor +
                      " asynchronously, but this server runs without BYTEPS_ENABLE_ASYNC=1: "
                      "set it on every worker and server");
  if (item->host_merged || item->process_set != 0)
    return refuse(ErrorKind::kInternal, "worker rank " + std::to_string(rank) +
                                            " sent a merged or process-set asynchronous push of " +
                                            tensor);
  if (!key->asynchronous) {
    if (key->active || key->last_closed > 0)
      return refuse(ErrorKind::kMismatch, "worker rank " + std::to_string(rank) + " trains " +
                                              tensor +
                                              " asynchronously (BYTEPS_ENABLE_ASYNC=1), "
                                              "but other workers synchronise it");
    key->asynchronous = true;
    key->kind = OpKind::kAsyncPushPull;
    key->dtype = item->dtype;
    key->signature = item->signature;
    key->length = item->length;
    key->async_rounds.assign(num_workers_, 0);
    key->contributors = {rank};  // Who set the shape the others must match.
  }
  if (item->signature != key->signature || item->dtype != key->dtype || item->length != key->length)
    return refuse(ErrorKind::kMismatch,
                  MismatchMessage(item->tensor_id, key->contributors.front(), rank));
  if (item->round <= key->async_rounds[rank])
    return refuse(ErrorKind::kAborted, "worker rank " + std::to_string(rank) + " sent round " +
                                           std::to_string(item->round) + " of " + tensor +
                                           " after its round " +
                                           std::to_string(key->async_rounds[rank]) +
                                           "; it is refused so that no update is applied twice");
  const bool first = key->async_rounds[rank] == 0;
  key->async_rounds[rank] = item->round;
  key->bytes_in += item->length;
  if (!key->parameters.data) {
    if (!first)
      return refuse(ErrorKind::kAborted, "worker rank " + std::to_string(rank) +
                                             " sent an update of " + tensor +
                                             " before rank 0 gave its initial value");
    if (rank != 0) {  // Every worker starts from rank 0's values.
      key->awaiting_parameters.emplace_back(rank, item->round);
      pool_.Release(std::move(item->block));
      return;
    }
    try {
      key->parameters = pool_.Acquire(key->length);
    } catch (const std::bad_alloc&) {
      return refuse(ErrorKind::kInternal, "no memory for the parameters of " + tensor);
    }
    std::memcpy(key->parameters.data.get(), item->data(), key->length);
    for (const auto& [waiting, round] : key->awaiting_parameters) {
      SendReply(waiting, id, round, key->parameters.data.get(), key->length);
      key->bytes_out += key->length;
    }
    key->awaiting_parameters.clear();
  } else if (!first) {  // A first push after rank 0's only fetches the parameters.
    const auto dtype = static_cast<DataType>(key->dtype);
    ReduceInto(ReduceOp::kSum, dtype, key->parameters.data.get(), item->data(),
               key->length / DataTypeSize(dtype));
  }
  pool_.Release(std::move(item->block));
  SendReply(rank, id, item->round, key->parameters.data.get(), key->length);
  key->bytes_out += key->length;
}

void Server::Forget(Engine* engine, uint32_t rank) {
  // A round it pushed to and that is still open may read its memory: it ends here.
  // (A worker that shuts down cleanly has none: its pushes were all answered.)
  for (auto& [id, key] : engine->keys) {
    if (!key.active ||
        std::find(key.contributors.begin(), key.contributors.end(), rank) == key.contributors.end())
      continue;
    FailRound(id, &key, ErrorKind::kPeerGone,
              "worker rank " + std::to_string(rank) + " has shut down, so tensor " +
                  Describe(id.tensor_id, rank) + " cannot complete");
  }
  std::shared_ptr<WorkerConn> worker = ConnOf(rank);
  if (worker && --worker->forgetting == 0) worker->channel->ForgetPeerMemory();
}

void Server::Abandon(const PartitionKey& id, KeyState* key, const PushItem& item) {
  if (key->asynchronous || item.kind == OpKind::kAsyncPushPull) {
    // Rounds of an asynchronous key wait for nobody, but for rank 0's first push.
    auto& waiting = key->awaiting_parameters;
    waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                                 [&](const auto& w) { return w.first == item.rank; }),
                  waiting.end());
    if (item.rank == 0 && !key->parameters.data) {
      for (const auto& [rank, round] : waiting)
        SendError(rank, id, round, ErrorKind::kAborted,
                  "worker rank 0 gave up its first round of tensor " +
                      Describe(item.tensor_id, rank) +
                      ", so the servers have no initial parameters to start from");
      waiting.clear();
    }
    return;
  }
  const std::string why = "worker rank " + std::to_string(item.rank) + " gave up round " +
                          std::to_string(item.round) + " of tensor " +
                          Describe(item.tensor_id, item.rank) +
                          " (its operation failed or timed out there)";
  if (key->active && item.round >= key->round) {
    FailRound(id, key, ErrorKind::kAborted, why);
    key->last_closed = item.round;
  } else if (!key->active && item.round > key->last_closed) {
    key->last_closed = item.round;
    key->closed_error = why;
    key->closed_kind = ErrorKind::kAborted;
  }
}

void Server::Accumulate(KeyState* key, PushItem* item) {
  if (!IsReduction(key->kind)) {
    Contribution& mine = key->by_rank[item->rank];
    mine.block = std::move(item->block);
    mine.shared = item->shared;
    mine.length = item->length;
    mine.rows = item->rows;
    return;
  }
  const auto dtype = static_cast<DataType>(key->dtype);
  if (item->shared) {
    key->shared.push_back(item->shared);
  } else if (!key->sum.data) {
    key->sum = std::move(item->block);
  } else {
    ReduceInto(key->reduce_op, dtype, key->sum.data.get(), item->block.data.get(),
               key->length / DataTypeSize(dtype));
    pool_.Release(std::move(item->block));
  }
}

char* Server::ResultSlot(const PartitionKey& id, KeyState* key, size_t length) {
  char* slot = nullptr;
  Status status = listener_.shared_results().Slot(SlotKey{id}, length, &slot, &key->result_slot);
  if (!status.ok()) {
    SetFailure(status.message());
    return nullptr;
  }
  key->holds_result_slot = true;  // until the round closes, after the replies
  return slot;
}

const char* Server::Complete(const PartitionKey& id, KeyState* key, size_t* length) {
  // A shared slot only pays when a same-host worker reads the result.
  bool any_local = false;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (uint32_t r : key->contributors) {
      const bool reader = key->owner < 0 || static_cast<int32_t>(r) == key->owner;
      any_local = any_local || (reader && conns_[r] && conns_[r]->channel->shares_memory());
    }
  }
  const auto dtype = static_cast<DataType>(key->dtype);
  switch (key->kind) {
    case OpKind::kPushPull:
    case OpKind::kReduceScatter: {
      *length = key->length;
      if (key->shared.empty()) return key->sum.data.get();  // Reduced as the pushes came in.
      char* out = ResultSlot(id, key, key->length);
      if (!out) return nullptr;
      const size_t count = key->length / DataTypeSize(dtype);
      // Shared inputs are read once each: the first pair lands in the result directly.
      std::vector<const char*> inputs = key->shared;
      if (key->sum.data) inputs.insert(inputs.begin(), key->sum.data.get());
      if (inputs.size() == 1) {
        std::memcpy(out, inputs[0], key->length);
      } else {
        ReduceOf(key->reduce_op, dtype, out, inputs[0], inputs[1], count);
        for (size_t i = 2; i < inputs.size(); ++i)
          ReduceInto(key->reduce_op, dtype, out, inputs[i], count);
      }
      return out;
    }
    case OpKind::kBroadcast: {
      // The root's push is the result; same-host receivers need it in a slot of ours.
      const Contribution* root = nullptr;
      for (const Contribution& c : key->by_rank)
        if (c.length) root = &c;
      *length = root ? root->length : 0;
      if (!root) return "";  // An empty tensor: nothing to send but the acknowledgements.
      // Same-host receivers read a copy in our memory: a worker's own memory is read
      // only by us, so that it knows when nobody reads it any more.
      if (!any_local) return root->data();
      char* out = ResultSlot(id, key, root->length);
      if (out) std::memcpy(out, root->data(), root->length);
      return out;
    }
    case OpKind::kAllgather:
    case OpKind::kAlltoall: {
      // The sizes step returns every member's row count, then what each pushed (an
      // alltoall's splits); the data steps only the rows, in the group's order.
      const int size = static_cast<int>(key->members.size());
      const bool sizes = id.part == kSizesPart;
      *length = sizes ? AllgatherTableBytes(size) : 0;
      const Contribution* only = nullptr;
      int pieces = 0;
      for (const Contribution& c : key->by_rank) {
        *length += c.length;
        if (c.length) {
          ++pieces;
          only = &c;
        }
      }
      // An allgather partition holds one worker's rows: they go out from where they
      // arrived, but to same-host workers from our memory (as a broadcast's).
      if (!sizes && pieces <= 1 && !(only && any_local)) return only ? only->data() : "";
      char* out = nullptr;
      if (any_local) {
        out = ResultSlot(id, key, *length);
      } else {
        key->sum = pool_.Acquire(*length);
        out = key->sum.data.get();
      }
      if (!out) return nullptr;
      char* cursor = out;
      if (sizes) {
        for (int i = 0; i < size; ++i)
          std::memcpy(out + i * sizeof(int64_t), &key->by_rank[key->members[i]].rows,
                      sizeof(int64_t));
        cursor += AllgatherTableBytes(size);
      }
      for (uint32_t member : key->members) {  // ranks ascending: the group's order
        const Contribution& c = key->by_rank[member];
        if (c.length) std::memcpy(cursor, c.data(), c.length);
        cursor += c.length;
      }
      return out;
    }
    case OpKind::kAsyncPushPull:  // Asynchronous keys answer each push (ProcessAsync).
      break;
  }
  return nullptr;
}

size_t Server::Reply(const PartitionKey& id, const KeyState& key, const char* result,
                     size_t length) {
  // Who receives the result: the owner, a broadcast's receivers, or everyone. The
  // others get an empty acknowledgement, sent last: a broadcast root may overwrite its
  // pushed data once it is answered.
  auto receives = [&](uint32_t r) {
    if (key.owner >= 0) return static_cast<int32_t>(r) == key.owner;
    return key.kind != OpKind::kBroadcast || key.by_rank[r].length == 0;
  };
  // Sends block, one worker after another: starting each partition's replies at a
  // different worker keeps every server from serving the same worker first, which
  // would leave that worker's link the bottleneck and the others idle.
  size_t receivers = 0;
  const size_t count = key.contributors.size();
  const size_t first = count ? (id.part + key.round) % count : 0;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t r = key.contributors[(first + i) % count];
    if (!receives(r)) continue;
    SendReply(r, id, key.round, result, length);
    ++receivers;
  }
  for (uint32_t r : key.contributors)
    if (!receives(r)) SendReply(r, id, key.round, nullptr, 0);
  return receivers;
}

void Server::LogTraffic() {
  if (!LogEnabled(LogLevel::kDebug)) return;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> by_tensor;  // id -> (in, out)
  for (auto& engine : engines_)
    for (const auto& [id, key] : engine->keys) {
      by_tensor[id.tensor_id].first += key.bytes_in;
      by_tensor[id.tensor_id].second += key.bytes_out;
    }
  for (const auto& [tensor_id, traffic] : by_tensor)
    BPS_LOG(kDebug) << "tensor " << Describe(tensor_id, 0) << " moved " << traffic.first
                    << " bytes in and " << traffic.second << " bytes out";
}

void Server::FailRound(const PartitionKey& id, KeyState* key, ErrorKind kind,
                       const std::string& message, const PushItem* refused) {
  for (uint32_t r : key->contributors) SendError(r, id, key->round, kind, message);
  // The refused push hears it for its own round: every push gets one answer.
  if (refused && std::find(key->contributors.begin(), key->contributors.end(), refused->rank) ==
                     key->contributors.end())
    SendError(refused->rank, id, refused->round, kind, message);
  key->closed_error = message;
  key->closed_kind = kind;
  key->last_closed = std::max(key->last_closed, key->round);
  CloseRound(key);
}

void Server::CloseRound(KeyState* key) {
  if (key->holds_result_slot) listener_.shared_results().Release(key->result_slot);
  key->holds_result_slot = false;
  key->active = false;
  key->contributors.clear();
  key->covered.clear();
  key->shared.clear();
  pool_.Release(std::move(key->sum));
  for (Contribution& c : key->by_rank) pool_.Release(std::move(c.block));
  key->by_rank.clear();
}

std::shared_ptr<Server::WorkerConn> Server::ConnOf(uint32_t rank) {
  std::lock_guard<std::mutex> lock(conns_mutex_);
  return conns_[rank];
}

void Server::SendToWorker(uint32_t rank, const FrameHeader& header, const void* payload) {
  std::shared_ptr<WorkerConn> worker = ConnOf(rank);
  // A failed send needs no handling here: that worker's reader sees the broken
  // connection and fails the job with the reason.
  Status status = worker ? worker->channel->Send(header, payload) : Status::OK();
  if (!status.ok()) BPS_LOG(kDebug) << status.message();
}

void Server::SendReply(uint32_t rank, const PartitionKey& id, uint32_t round, const void* data,
                       size_t length) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kReply);
  header.tensor_id = id.tensor_id;
  header.part = id.part;
  header.round = round;
  header.length = length;
  std::shared_ptr<WorkerConn> worker = ConnOf(rank);
  Status status = worker ? worker->channel->SendData(header, data, SlotKey{id}) : Status::OK();
  if (!status.ok()) BPS_LOG(kDebug) << status.message();  // As in SendToWorker.
}

void Server::SendError(uint32_t rank, const PartitionKey& id, uint32_t round, ErrorKind kind,
                       const std::string& message) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kError);
  header.error_kind = static_cast<uint8_t>(kind);
  header.tensor_id = id.tensor_id;
  header.part = id.part;
  header.round = round;
  header.length = message.size();
  SendToWorker(rank, header, message.data());
}

std::string Server::Describe(uint64_t tensor_id, uint32_t rank) {
  std::lock_guard<std::mutex> lock(declarations_mutex_);
  auto it = declarations_.find({tensor_id, rank});
  // Another worker's name for it will do (a host's merged pushes come from its leaders).
  if (it == declarations_.end()) it = declarations_.lower_bound({tensor_id, 0});
  if (it == declarations_.end() || it->first.first != tensor_id)
    return "with id " + std::to_string(tensor_id);
  return "'" + it->second.name + "'";
}

std::string Server::MismatchMessage(uint64_t tensor_id, uint32_t rank_a, uint32_t rank_b) {
  std::lock_guard<std::mutex> lock(declarations_mutex_);
  auto a = declarations_.find({tensor_id, rank_a});
  auto b = declarations_.find({tensor_id, rank_b});
  if (a == declarations_.end() || b == declarations_.end())
    return "workers sent tensor id " + std::to_string(tensor_id) + " with different sizes";
  return MismatchText(a->second, rank_a, b->second, rank_b);
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
    item.kind_of_item = PushItem::Kind::kFailRounds;
    {
      std::lock_guard<std::mutex> lock(engine->mutex);
      engine->queue.push_front(std::move(item));
    }
    engine->cv.notify_one();
  }
}

void Server::FailRounds(Engine* engine, const std::string& reason) {
  for (auto& [id, key] : engine->keys) {
    for (const auto& [rank, round] : key.awaiting_parameters)
      SendError(rank, id, round, ErrorKind::kPeerGone,
                "the job is failing: " + reason + " (tensor " + Describe(id.tensor_id, rank) + ")");
    key.awaiting_parameters.clear();
    if (!key.active) continue;
    FailRound(id, &key, ErrorKind::kPeerGone,
              "the job is failing: " + reason + " (tensor " +
                  Describe(id.tensor_id, key.contributors.front()) + ")");
  }
}

std::string Server::failure() {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

void Server::Stop(const std::string& reason) {
  if (stopping_.exchange(true)) return;
  listener_.Close();
  if (acceptor_.joinable()) acceptor_.join();
  if (!reason.empty()) {
    FrameHeader bye;
    bye.type = static_cast<uint8_t>(FrameType::kBye);
    bye.length = reason.size();
    for (int r = 0; r < num_workers_; ++r) {
      std::shared_ptr<WorkerConn> worker = ConnOf(static_cast<uint32_t>(r));
      if (!worker) continue;
      worker->channel->SetSendTimeout(200);  // Best effort: a stuck worker must not hold us.
      worker->channel->Send(bye, reason.data());
    }
  }
  std::vector<Reader> readers;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (auto& reader : readers_)
      if (reader.conn->channel) reader.conn->channel->Shutdown();
    readers.swap(readers_);
  }
  for (auto& engine : engines_) {
    { std::lock_guard<std::mutex> lock(engine->mutex); }
    engine->cv.notify_all();
    if (engine->thread.joinable()) engine->thread.join();
  }
  LogTraffic();  // The engines' state is still and ours now.
  for (auto& reader : readers) {
    std::lock_guard<std::mutex> lock(reader.conn->mutex);
    reader.conn->outstanding = 0;
    reader.conn->cv.notify_all();
  }
  for (auto& reader : readers) reader.thread.join();
  for (int fd : failure_pipe_)
    if (fd >= 0) ::close(fd);
}

}  // namespace bps
