#include "worker.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "../common/logging.h"
#include "../common/reduce.h"

namespace bps {
namespace {

// How long a link whose sends failed waits for its receiver to read what the server
// sent before it went away.
constexpr std::chrono::seconds kDrainGrace{1};

}  // namespace

// ---------------------------------------------------------------------------
// ServerLink

namespace {

// The credit counts partitions of BYTEPS_PARTITION_BYTES. Across hosts, tensors are
// cut into pieces of kNetworkPartitionBytes (EvenPartitionBytes); the credit shrinks
// with them, so that as many pieces, not as many bytes, are in flight: a deep queue at
// a link delays every sum behind it. Measured (network_bound.py at 400 Mbit/s, 4
// workers, 2 server hosts, 64 MB in 512 KiB pieces): 3.37 s with 8 MiB in flight per
// server, 2.95 s with 1 MiB.
// Flows queued at one link share it by the bytes each has queued there, so a server
// with a larger share of the partitions (placement.py) gets as much more in flight.
size_t CreditBytes(const WorkerOptions& options, int server) {
  size_t credit = options.credit_bytes;
  if (options.across_hosts && options.partition_bytes > kNetworkPartitionBytes)
    credit = credit / options.partition_bytes * kNetworkPartitionBytes;
  const std::vector<uint32_t>& shares = options.server_shares;
  if (shares.empty() || shares[server] == 0) return credit;
  uint32_t least = shares[server];
  for (uint32_t share : shares)
    if (share > 0) least = std::min(least, share);
  return credit / least * shares[server];
}

// Where the servers' shares differ: the partitions the links' credits let be in flight
// together (see Worker::push_window). Not with a local merge: a worker then pushes
// only the partitions it leads, and the count of answers would lag the indices.
uint32_t PushWindow(const WorkerOptions& options) {
  if (options.server_shares.empty() || options.credit_bytes == 0 || options.local_ranks.size() > 1)
    return 0;
  size_t bytes = 0;
  for (size_t i = 0; i < options.servers.size(); ++i)
    bytes += CreditBytes(options, static_cast<int>(i));
  const size_t piece =
      std::min(options.partition_bytes, options.across_hosts ? kNetworkPartitionBytes : SIZE_MAX);
  return static_cast<uint32_t>(std::max<size_t>(1, bytes / std::max<size_t>(1, piece)));
}

}  // namespace

ServerLink::ServerLink(Worker* worker, int index, ServerAddress address,
                       std::unique_ptr<Channel> channel)
    : worker_(worker),
      index_(index),
      address_(std::move(address)),
      channel_(std::move(channel)),
      credits_(CreditBytes(worker->options(), index)) {}

ServerLink::~ServerLink() { Join(); }

std::string ServerLink::description() const {
  return "server " + std::to_string(index_) + " (" + address_.host + ":" +
         std::to_string(address_.port) + ")";
}

void ServerLink::Start() {
  push_stage_.Start([this](PartitionTask& partition) { return Push(partition); },
                    [this](const PartitionTask& partition) { return Admit(partition); });
  receiver_ = std::thread([this] { ReceiveLoop(); });
}

Timeline* ServerLink::TracerFor(const Task& task) const {
  Timeline* timeline = worker_->timeline();
  return timeline && timeline->Traces(task.round()) ? timeline : nullptr;
}

void ServerLink::Enqueue(PartitionTask task) {
  if (TracerFor(*task.task)) task.queued_at = Timeline::Now();
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending_[PartitionKey{task.task->tensor_id(), task.part}] = Pending{
        task.task, task.part, task.offset, task.reply_length, task.priority, task.push_length};
  }
  push_stage_.Push(std::move(task));
}

void ServerLink::SendProcessSet(uint32_t id, const std::vector<int32_t>& ranks) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kProcessSet);
  header.rank = static_cast<uint32_t>(worker_->options().rank);
  header.process_set = id;
  header.length = ranks.size() * sizeof(int32_t);
  Status status = channel_->Send(header, ranks.data());
  if (!status.ok()) BPS_LOG(kDebug) << status.message();  // Reported by the link's threads.
}

void ServerLink::Abandon(uint64_t tensor_id, uint32_t round, OpKind kind) {
  channel_->RetireSlots(tensor_id);
  std::vector<uint32_t> parts;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->first.tensor_id == tensor_id && it->second.task->round() == round) {
        parts.push_back(it->second.part);
        ReturnCredit(it->second);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  SendAbandons(tensor_id, round, kind, parts);
}

void ServerLink::AbandonUnsent(uint64_t tensor_id, uint32_t round, uint32_t part, OpKind kind) {
  SendAbandons(tensor_id, round, kind, {part});
}

void ServerLink::SendAbandons(uint64_t tensor_id, uint32_t round, OpKind kind,
                              const std::vector<uint32_t>& parts) {
  if (parts.empty() || worker_->stopping()) return;
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kAbandon);
  header.op_kind = static_cast<uint8_t>(kind);
  header.rank = static_cast<uint32_t>(worker_->options().rank);
  header.tensor_id = tensor_id;
  header.round = round;
  for (uint32_t part : parts) {
    header.part = part;
    // Best effort: if the server is gone, its rounds are gone with it.
    if (!channel_->Send(header, nullptr).ok()) return;
  }
}

bool ServerLink::Admit(const PartitionTask& partition) {
  // The window lets a tensor's earliest unanswered partition go, so it never stalls.
  const uint32_t window = worker_->push_window();
  if (window && partition.part >= partition.task->answered() + window) return false;
  return credits_.TryTake(partition.priority, partition.push_length);
}

void ServerLink::ReturnCredit(const Pending& pending) {
  if (!pending.credited) return;
  credits_.Return(pending.priority, pending.push_length);
  push_stage_.Recheck();
}

bool ServerLink::Push(PartitionTask& partition) {
  Task& task = *partition.task;
  {
    // The credit Admit took stays with the pending partition until its answer.
    std::lock_guard<std::mutex> lock(pending_mutex_);
    auto it = pending_.find(PartitionKey{task.tensor_id(), partition.part});
    if (it != pending_.end() && it->second.task == partition.task) {
      it->second.credited = true;
    } else {
      credits_.Return(partition.priority, partition.push_length);  // abandoned meanwhile
    }
  }
  if (!task.BeginIo()) return true;  // Failed meanwhile: nothing to send.
  Timeline* const tracer = TracerFor(task);
  const int64_t served_at = tracer ? Timeline::Now() : 0;
  FrameHeader header;
  header.rank = static_cast<uint32_t>(worker_->options().rank);
  header.part = partition.part;
  header.round = task.round();
  header.op_kind = static_cast<uint8_t>(task.kind());
  header.tensor_id = task.tensor_id();
  header.signature = partition.signature;
  header.dtype = static_cast<uint8_t>(task.dtype());
  header.reduce_op = static_cast<uint8_t>(task.op().reduce_op);
  header.owner = partition.owner;
  header.process_set = task.op().process_set;
  header.flags = partition.flags;
  if (IsGather(task.kind())) header.rows = task.op().shape[0];
  Status status = SendPartition(partition, &header);
  if (tracer && status.ok()) {
    const int64_t pushed_at = Timeline::Now();
    tracer->Stage(task.name(), task.round(), partition.part, "QUEUE", partition.queued_at,
                  served_at);
    tracer->Stage(task.name(), task.round(), partition.part, "PUSH", served_at, pushed_at);
    std::lock_guard<std::mutex> lock(pending_mutex_);
    auto it = pending_.find(PartitionKey{task.tensor_id(), partition.part});
    if (it != pending_.end() && it->second.task == partition.task) it->second.pushed_at = pushed_at;
  }
  task.EndIo();
  BPS_LOG(kTrace) << "pushed " << task.name() << " part " << partition.part << " round "
                  << task.round() << " to " << description();
  if (status.ok()) return true;
  // The server may have said why it is going away (a worker died, say) before the
  // socket broke: let the receiver read that first, then fail what is left.
  channel_->ShutdownWrite();
  {
    std::unique_lock<std::mutex> lock(receiver_mutex_);
    receiver_cv_.wait_for(lock, kDrainGrace, [this] { return receiver_done_; });
  }
  worker_->OnLinkFailure(status.message() + " while pushing tensor '" + task.name() + "' to " +
                         description());
  return false;
}

Status ServerLink::SendPartition(const PartitionTask& partition, FrameHeader* header) {
  // The server hears a tensor's declaration before its first push, and again whenever
  // anything in it changes (a gather's first dimension too, which bounds what the
  // server accepts).
  const Task& task = *partition.task;
  uint64_t& declared = declared_[task.tensor_id()];
  if (declared != task.declaration_hash()) {
    header->type = static_cast<uint8_t>(FrameType::kDeclare);
    header->length = task.declaration_frame().size();
    Status status = channel_->Send(*header, task.declaration_frame().data());
    if (!status.ok()) return status;
    declared = task.declaration_hash();
  }
  header->type = static_cast<uint8_t>(FrameType::kPush);
  header->length = partition.push_length;
  // A broadcast root's data goes to the receivers from where it lies; alternating
  // copies keep its next round from overwriting what they may still be reading.
  const uint32_t copy = task.kind() == OpKind::kBroadcast ? task.round() % 2 : 0;
  return channel_->SendData(*header, partition.data,
                            SlotKey{{task.tensor_id(), partition.part}, copy});
}

bool ServerLink::TakePending(const FrameHeader& header, Pending* pending) {
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    auto it = pending_.find(PartitionKey{header.tensor_id, header.part});
    // A reply for another round answers a task that already failed: never use it.
    if (it == pending_.end() || it->second.task->round() != header.round) return false;
    *pending = it->second;
    ReturnCredit(it->second);
    pending_.erase(it);
  }
  pending->task->CountAnswer();
  worker_->OnAnswer();
  return true;
}

void ServerLink::FinishPartition(const Task& task, void* data, size_t bytes) {
  if (!IsReduction(task.kind())) return;
  const Declaration& op = task.op();
  const size_t count = bytes / DataTypeSize(op.dtype);
  if (op.reduce_op == ReduceOp::kAverage) DivideInPlace(op.dtype, data, count, task.group().size());
  ScaleInPlace(op.dtype, data, count, op.postscale);
}

Status ServerLink::HandleReply(const FrameHeader& header, DataReader* payload) {
  const bool error = header.type == static_cast<uint8_t>(FrameType::kError);
  // Read an error's message first: the stream must stay in step whatever the task's fate.
  std::string message;
  if (error) {
    if (header.length > (1u << 20))
      return Status::Error(description() + " sent an oversized error");
    message.resize(header.length);
    Status status = payload->Read(message.data(), message.size());
    if (!status.ok()) return status;
  }
  Pending pending;
  if (!TakePending(header, &pending)) return payload->Skip();
  Task& task = *pending.task;
  if (error) {
    const uint8_t kind = header.error_kind;
    task.Fail(Status::Error(kind <= static_cast<uint8_t>(ErrorKind::kShutdown)
                                ? static_cast<ErrorKind>(kind)
                                : ErrorKind::kInternal,
                            message));
    return Status::OK();
  }
  const uint64_t length = header.length;
  if (length != pending.reply_length) {
    task.Fail(Status::Error(ErrorKind::kInternal,
                            description() + " returned a malformed result (" +
                                std::to_string(length) + " bytes where " +
                                std::to_string(pending.reply_length) + " were due) for partition " +
                                std::to_string(header.part) + " of tensor '" + task.name() + "'"));
    return payload->Skip();
  }
  if (!task.BeginIo()) return payload->Skip();
  if (IsGather(task.kind()) && header.part == kSizesPart) {
    // The first step of a gather: now the output's size and this worker's place in
    // it are known, and the rows can move.
    std::vector<char> sizes(length);
    Status status = payload->Read(sizes.data(), length);
    Status started = status.ok() ? worker_->StartGatherData(pending.task, sizes) : status;
    task.EndIo();
    if (!status.ok()) return status;  // The stream is broken.
    if (!started.ok()) {
      task.Fail(started);
    } else {
      task.PartitionDone();
    }
    return Status::OK();
  }
  void* dst = static_cast<char*>(task.output()) + pending.offset;
  Status status = payload->Read(dst, length);
  if (status.ok()) FinishPartition(task, dst, length);
  if (Timeline* tracer = TracerFor(task); tracer && status.ok() && pending.pushed_at)
    tracer->Stage(task.name(), task.round(), header.part, "PULL", pending.pushed_at,
                  Timeline::Now());
  task.EndIo();
  if (!status.ok()) return status;
  task.PartitionDone();
  return Status::OK();
}

Status ServerLink::HandleJoined(const FrameHeader& header, DataReader* payload) {
  constexpr size_t kEntry = sizeof(uint64_t) + sizeof(uint32_t);
  // Bounded before allocating: a last rank, then one entry per key of the server.
  if (header.length < sizeof(int32_t) || (header.length - sizeof(int32_t)) % kEntry != 0 ||
      header.length > (64u << 20))
    return Status::Error("a malformed join reply from " + description());
  std::vector<char> entries(header.length);
  Status status = payload->Read(entries.data(), entries.size());
  if (!status.ok()) return status;
  int32_t last;
  std::memcpy(&last, entries.data(), sizeof(last));
  std::unordered_map<uint64_t, uint32_t> rounds;
  for (size_t at = sizeof(last); at < entries.size(); at += kEntry) {
    uint64_t tensor_id;
    uint32_t round;
    std::memcpy(&tensor_id, entries.data() + at, sizeof(tensor_id));
    std::memcpy(&round, entries.data() + at + sizeof(tensor_id), sizeof(round));
    uint32_t& known = rounds[tensor_id];
    known = std::max(known, round);
  }
  worker_->OnJoined(index_, last, rounds);
  return Status::OK();
}

void ServerLink::SendJoin() {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kJoin);
  header.rank = static_cast<uint32_t>(worker_->options().rank);
  Status status = channel_->Send(header, nullptr);
  if (!status.ok()) BPS_LOG(kDebug) << status.message();  // Reported by the link's threads.
}

void ServerLink::ReceiveLoop() {
  while (true) {
    FrameHeader header;
    DataReader payload;
    bool eof = false;
    Status status = channel_->Receive(&header, &payload, &eof);
    if (status.ok()) {
      const auto type = static_cast<FrameType>(header.type);
      if (type == FrameType::kReply || type == FrameType::kError) {
        status = HandleReply(header, &payload);
      } else if (type == FrameType::kJoined) {
        status = HandleJoined(header, &payload);
      } else if (type == FrameType::kBye && header.length <= (1u << 20)) {
        std::string why(header.length, '\0');
        status = payload.Read(why.data(), why.size());
        if (status.ok()) status = Status::Error(description() + " is stopping: " + why);
      } else {
        status = Status::Error("unexpected frame type " + std::to_string(header.type) + " from " +
                               description());
      }
    }
    if (!status.ok()) {
      if (!worker_->stopping()) worker_->OnLinkFailure(status.message());
      {
        std::lock_guard<std::mutex> lock(receiver_mutex_);
        receiver_done_ = true;
      }
      receiver_cv_.notify_all();
      return;
    }
  }
}

void ServerLink::FailPending(const Status& reason) {
  std::unordered_map<PartitionKey, Pending, PartitionKeyHash> pending;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending.swap(pending_);
    for (auto& entry : pending) ReturnCredit(entry.second);
  }
  for (auto& entry : pending)
    entry.second.task->Fail(reason.WithSuffix(" (tensor '" + entry.second.task->name() + "')"));
}

void ServerLink::FailExpired(std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<std::shared_ptr<Task>, uint32_t>> expired;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (const auto& entry : pending_)
      if (entry.second.task->expired(now))
        expired.emplace_back(entry.second.task, entry.second.part);
  }
  for (auto& [task, part] : expired) {
    task->Fail(Status::Error(ErrorKind::kTimeout,
                             std::string(OpKindName(task->kind())) + " of tensor '" + task->name() +
                                 "' (round " + std::to_string(task->round()) +
                                 ") timed out after " + std::to_string(task->timeout_seconds()) +
                                 " s waiting for " + description() + " to return partition " +
                                 std::to_string(part) +
                                 " (a worker may not have sent it; see BYTEPS_OP_TIMEOUT)"));
  }
}

void ServerLink::Close(int rank) {
  push_stage_.Close();
  push_stage_.Join();
  FrameHeader bye;
  bye.type = static_cast<uint8_t>(FrameType::kBye);
  bye.rank = static_cast<uint32_t>(rank);
  channel_->Send(bye, nullptr);  // Best effort: the server may be gone already.
  channel_->Shutdown();
}

void ServerLink::Join() {
  push_stage_.Join();
  if (receiver_.joinable()) receiver_.join();
}

// ---------------------------------------------------------------------------
// Worker

Worker::Worker(WorkerOptions options)
    : options_(std::move(options)),
      server_cycle_(ServerCycle(options_.server_shares, options_.servers.size())),
      push_window_(PushWindow(options_)) {}

Worker::~Worker() { Stop(); }

void Worker::OnAnswer() {
  if (!push_window_) return;
  for (auto& link : links_) link->Recheck();
}

Status Worker::Start() {
  if (options_.servers.empty()) return Status::Error("no servers to connect to");
  for (size_t i = 0; i < options_.servers.size(); ++i) {
    const ServerAddress& address = options_.servers[i];
    const std::string peer = "server " + std::to_string(i) + " (" + address.host + ":" +
                             std::to_string(address.port) + ")";
    std::unique_ptr<Channel> channel;
    Status status = ConnectToServer(address, peer, options_.token, options_.rank,
                                    options_.timeout_ms, &channel, &start_cancel_, slots_);
    if (status.kind() == ErrorKind::kAborted) return status;  // The job's abort, as it came.
    if (!status.ok())
      return Status::Error(ErrorKind::kPeerGone, "worker " + std::to_string(options_.rank) +
                                                     " cannot reach " + peer + ": " +
                                                     status.message());
    links_.push_back(
        std::make_unique<ServerLink>(this, static_cast<int>(i), address, std::move(channel)));
  }
  for (auto& link : links_) link->Start();
  if (options_.local_ranks.size() > 1) {
    LocalMergeOptions local;
    local.ranks = options_.local_ranks;
    local.rank = options_.rank;
    local.size = options_.size;
    local.socket_prefix = options_.local_socket_prefix;
    local.token = options_.token;
    local.timeout_ms = options_.timeout_ms;
    local_ = std::make_unique<LocalMerge>(this, std::move(local), slots_);
    Status status = local_->Start(&start_cancel_);
    if (!status.ok()) return status;
  }
  watchdog_ = std::thread([this] { WatchdogLoop(); });
  BPS_LOG(kInfo) << "worker " << options_.rank << " of " << options_.size << " connected to "
                 << links_.size() << " server(s)";
  return Status::OK();
}

Status Worker::fatal_error() {
  std::lock_guard<std::mutex> lock(fatal_mutex_);
  return fatal_;
}

Worker::TensorEntry& Worker::EntryLocked(const std::string& name) {
  auto it = registry_.find(name);
  if (it == registry_.end()) {
    TensorEntry fresh;
    fresh.id = StableHash(name.data(), name.size());
    fresh.order = registry_.size();
    // A tensor first used here after a join may have had rounds without this worker.
    auto floor = round_floors_.find(fresh.id);
    if (floor != round_floors_.end()) fresh.round = floor->second;
    it = registry_.emplace(name, fresh).first;
  }
  return it->second;
}

void Worker::StartTimeline(const std::string& path, uint32_t first, uint32_t last) {
  timeline_ = std::make_unique<Timeline>(path, first, last);
}

void Worker::Declare(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(registry_mutex_);
  for (const std::string& name : names) EntryLocked(name);
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
  Group group;
  status = GroupOf(spec.op, &group);
  if (status.ok()) status = CheckTaskSpec(spec, group);
  if (!status.ok()) {
    done(status);
    return;
  }
  if (spec.op.kind == OpKind::kAlltoall && spec.splits.empty())
    spec.splits.assign(group.size(), spec.op.shape[0] / group.size());
  TensorEntry entry;
  {
    std::lock_guard<std::mutex> lock(registry_mutex_);
    TensorEntry& known = EntryLocked(name);
    if (known.in_flight) {
      done(Status::Error(
          ErrorKind::kInvalidArgument,
          "tensor '" + name + "' is already in flight; concurrent operations need distinct names"));
      return;
    }
    known.in_flight = true;
    ++known.round;
    entry = known;
  }
  // The operation's whole time, queues included, if the timeline traces its step.
  int64_t traced_from = 0;
  if (timeline_) {
    timeline_->OperationStarted(entry.round);
    if (timeline_->Traces(entry.round)) traced_from = Timeline::Now();
  }
  const OpKind kind = spec.op.kind;
  // The result's size is known here only where it is the input's.
  const DataType dtype = spec.op.dtype;
  const size_t result_bytes =
      kind == OpKind::kPushPull || kind == OpKind::kBroadcast || kind == OpKind::kAsyncPushPull
          ? spec.bytes
          : 0;
  void* const result = spec.output;
  auto task = std::make_shared<Task>(
      std::move(spec), std::move(group), entry.id, entry.order, entry.round, options_.timeout_ms,
      std::move(allocate),
      [this, name, kind, dtype, result, result_bytes, id = entry.id, round = entry.round,
       traced_from, done = std::move(done)](const Status& status) {
        if (traced_from) timeline_->OperationEnded(name, round, traced_from);
        if (status.ok()) Sample(name, id, round, dtype, "result", result, result_bytes);
        OnTaskFinished(name, kind, id, round, status);
        done(status);
      });
  std::vector<PartitionTask> plan;
  status = Plan(task, &plan);
  if (status.ok()) {
    status = CheckFinite(*task);
    if (!status.ok()) AbandonUnsent(*task, plan);
  }
  if (!status.ok()) {
    // Failed first: launched with nothing to wait for, it would otherwise complete.
    task->Fail(status);
    task->Launch(0);
    return;
  }
  Sample(name, task->tensor_id(), task->round(), dtype, "pushed", task->source(),
         IsGather(kind) ? 0 : task->spec().bytes);
  task->Launch(static_cast<int>(plan.size()));
  const bool merged = local_ && local_->Merges(*task);
  if (local_ && !merged) local_->Announce(task);
  for (PartitionTask& item : plan) {
    if (merged) {
      local_->Contribute(std::move(item));
    } else {
      LinkFor(task->tensor_id(), item.part).Enqueue(std::move(item));
    }
  }
}

Status Worker::CheckFinite(const Task& task) const {
  const TaskSpec& spec = task.spec();
  const bool sums = IsReduction(task.kind()) || task.kind() == OpKind::kAsyncPushPull;
  if (!options_.nan_check || !sums ||
      AllFinite(task.dtype(), spec.input, spec.bytes / DataTypeSize(task.dtype())))
    return Status::OK();
  return Status::Error(ErrorKind::kInvalidArgument,
                       "tensor '" + task.name() + "' holds NaN or Inf on worker rank " +
                           std::to_string(options_.rank) + " at step " +
                           std::to_string(task.round()) + " (PERSEUS_ALLREDUCE_NANCHECK=1)");
}

void Worker::AbandonUnsent(const Task& task, const std::vector<PartitionTask>& plan) {
  const bool merged = local_ && local_->Merges(task);
  for (const PartitionTask& item : plan) {
    LinkFor(task.tensor_id(), item.part)
        .AbandonUnsent(task.tensor_id(), task.round(), item.part, task.kind());
    if (merged) local_->AbandonUnsent(task, item.part);
  }
}

Group Worker::GlobalGroup() const {
  Group group;
  group.ranks.resize(options_.size);
  for (int r = 0; r < options_.size; ++r) group.ranks[r] = r;
  group.index = options_.rank;
  return group;
}

Status Worker::GroupOf(const Declaration& op, Group* group) {
  if (op.process_set == 0) {
    *group = GlobalGroup();
    return Status::OK();
  }
  {
    std::lock_guard<std::mutex> lock(process_sets_mutex_);
    auto found = process_sets_.find(op.process_set);
    if (found == process_sets_.end())
      return Status::Error(ErrorKind::kInvalidArgument,
                           "process set " + std::to_string(op.process_set) +
                               " is not registered (tensor '" + op.name + "')");
    group->ranks = found->second;
  }
  auto mine = std::find(group->ranks.begin(), group->ranks.end(), options_.rank);
  if (mine == group->ranks.end())
    return Status::Error(ErrorKind::kInvalidArgument, "rank " + std::to_string(options_.rank) +
                                                          " is not a member of process set " +
                                                          std::to_string(op.process_set) +
                                                          " (tensor '" + op.name + "')");
  group->index = static_cast<int>(mine - group->ranks.begin());
  return Status::OK();
}

Status Worker::SetProcessSet(uint32_t id, std::vector<int32_t> ranks) {
  if (id == 0) return Status::Error(ErrorKind::kInvalidArgument, "process set 0 is the global one");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= options_.size || (i > 0 && ranks[i] == ranks[i - 1]))
      return Status::Error(ErrorKind::kInvalidArgument, "process set " + std::to_string(id) +
                                                            " has an invalid or repeated rank " +
                                                            std::to_string(ranks[i]));
  }
  {
    std::lock_guard<std::mutex> lock(process_sets_mutex_);
    if (ranks.empty()) {
      process_sets_.erase(id);
    } else {
      process_sets_[id] = ranks;
    }
  }
  // Every server learns it before any push that names it (same connection, in order).
  for (auto& link : links_) link->SendProcessSet(id, ranks);
  return Status::OK();
}

ServerLink& Worker::LinkFor(uint64_t tensor_id, uint32_t part) {
  const size_t length = server_cycle_.size();
  return *links_[server_cycle_[(tensor_id % length + part) % length]];
}

size_t Worker::PartitionBytes(DataType dtype) const {
  // Partitions hold whole elements so that servers and averaging never split one.
  const size_t element = DataTypeSize(dtype);
  return std::max(element, options_.partition_bytes / element * element);
}

PartitionTask Worker::Partition(const std::shared_ptr<Task>& task, uint32_t part, size_t offset,
                                const char* data, size_t push_length, size_t reply_length) const {
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

Status Worker::Plan(const std::shared_ptr<Task>& task, std::vector<PartitionTask>* plan) {
  const TaskSpec& spec = task->spec();
  const Declaration& op = spec.op;
  const Group& group = task->group();
  const int size = group.size();
  if (IsReduction(op.kind) && op.prescale != 1.0) {
    // Scale a copy: the input belongs to the framework. A push_pull's output is ours
    // until the task completes, and each partition's result arrives after its push.
    char* copy = static_cast<char*>(spec.output);
    if (op.kind == OpKind::kReduceScatter) {
      task->scratch().resize(spec.bytes);
      copy = task->scratch().data();
    }
    if (copy != spec.input) std::memcpy(copy, spec.input, spec.bytes);
    ScaleInPlace(op.dtype, copy, spec.bytes / DataTypeSize(op.dtype), op.prescale);
    task->set_source(copy);
  }
  const char* source = task->source();
  switch (op.kind) {
    case OpKind::kPushPull:
    case OpKind::kAsyncPushPull:
    case OpKind::kBroadcast: {
      const bool root = op.kind == OpKind::kBroadcast && op.root_rank == options_.rank;
      if (root && spec.output != spec.input) std::memcpy(spec.output, spec.input, spec.bytes);
      const size_t partition =
          EvenPartitionBytes(spec.bytes, DataTypeSize(op.dtype), options_.partition_bytes,
                             server_cycle_.size(), options_.across_hosts);
      for (size_t offset = 0; offset < spec.bytes; offset += partition) {
        const size_t length = std::min(partition, spec.bytes - offset);
        const uint32_t part = static_cast<uint32_t>(plan->size());
        if (op.kind != OpKind::kBroadcast) {
          plan->push_back(Partition(task, part, offset, source + offset, length, length));
        } else {  // The root's data crosses once; receivers send nothing.
          plan->push_back(
              Partition(task, part, offset, source + offset, root ? length : 0, root ? 0 : length));
        }
      }
      return Status::OK();
    }
    case OpKind::kReduceScatter: {
      // Partitions never straddle two ranks' rows, so each result goes to one rank.
      const size_t partition = PartitionBytes(op.dtype);
      const size_t row_bytes = RowBytes(op);
      std::vector<int64_t> mine = op.shape;
      mine[0] = ScatterRows(op.shape[0], group.index, size);
      Status status = task->AllocateOutput(mine);
      if (!status.ok()) return status;
      for (int owner = 0; owner < size; ++owner) {
        const size_t begin = ScatterFirstRow(op.shape[0], owner, size) * row_bytes;
        const size_t end = begin + ScatterRows(op.shape[0], owner, size) * row_bytes;
        for (size_t offset = begin; offset < end; offset += partition) {
          const size_t length = std::min(partition, end - offset);
          PartitionTask item =
              Partition(task, static_cast<uint32_t>(plan->size()), offset - begin, source + offset,
                        length, owner == group.index ? length : 0);
          item.owner = group.ranks[owner];
          plan->push_back(std::move(item));
        }
      }
      return Status::OK();
    }
    case OpKind::kAllgather:
    case OpKind::kAlltoall: {
      // First the sizes; the rows follow once every worker's are known.
      const size_t sizes_bytes = op.kind == OpKind::kAlltoall ? size * size * sizeof(int64_t) : 0;
      const char* splits = reinterpret_cast<const char*>(task->splits().data());
      plan->push_back(Partition(task, kSizesPart, 0, splits,
                                op.kind == OpKind::kAlltoall ? size * sizeof(int64_t) : 0,
                                AllgatherTableBytes(size) + sizes_bytes));
      return Status::OK();
    }
  }
  return Status::Error(ErrorKind::kInternal, "unknown operation kind");
}

size_t Worker::RowBytes(const Declaration& op) {
  size_t row_bytes = DataTypeSize(op.dtype);
  for (size_t i = 1; i < op.shape.size(); ++i) row_bytes *= static_cast<size_t>(op.shape[i]);
  return row_bytes;
}

Status Worker::StartGatherData(const std::shared_ptr<Task>& task, const std::vector<char>& sizes) {
  const TaskSpec& spec = task->spec();
  const Group& group = task->group();
  // Positions in the group (a process set), not global ranks.
  const int size = group.size(), rank = group.index;
  const size_t row_bytes = RowBytes(spec.op);
  // The reply: each worker's `rows`, then (alltoall) each worker's splits.
  std::vector<int64_t> table(sizes.size() / sizeof(int64_t));
  std::memcpy(table.data(), sizes.data(), table.size() * sizeof(int64_t));
  auto bad = [&](const std::string& what) {
    return Status::Error(ErrorKind::kInternal, "a server sent " + what + " in " +
                                                   OpKindName(spec.op.kind) + " of tensor '" +
                                                   spec.op.name + "'");
  };
  for (int64_t count : table) {
    // Bounded so that the sums below cannot overflow whatever a server sends.
    if (count < 0 || count > (int64_t{1} << 40))
      return bad("a row count of " + std::to_string(count));
  }
  if (table[rank] != spec.op.shape[0]) return bad("another row count for this worker");
  std::vector<int64_t> out_shape = spec.op.shape;
  if (spec.op.kind == OpKind::kAllgather) {
    int64_t total = 0;
    for (int r = 0; r < size; ++r) total += table[r];
    out_shape[0] = total;
    Status status = task->AllocateOutput(out_shape);
    if (!status.ok()) return status;
    // Each worker's rows are cut into partitions of their own, in the result's
    // order: a partition has one sender (the others push nothing), so the server
    // passes it on as it came, and each reply lands at its place in the output.
    const size_t partition = std::max<size_t>(1, options_.partition_bytes);
    std::vector<PartitionTask> plan;
    size_t offset = 0;
    for (int r = 0; r < size; ++r) {
      const size_t bytes = static_cast<size_t>(table[r]) * row_bytes;
      for (size_t at = 0; at < bytes; at += partition) {
        const size_t length = std::min(partition, bytes - at);
        plan.push_back(Partition(task, static_cast<uint32_t>(plan.size()) + 1, offset + at,
                                 task->source() + at, r == rank ? length : 0, length));
      }
      offset += bytes;
    }
    task->AddPartitions(static_cast<int>(plan.size()));
    for (PartitionTask& item : plan) LinkFor(task->tensor_id(), item.part).Enqueue(std::move(item));
    return Status::OK();
  }
  // Alltoall: row r of the matrix holds what rank r sends to each rank.
  const int64_t* matrix = table.data() + size;
  if (table.size() != static_cast<size_t>(size + size * size))
    return bad("a malformed split table");
  std::vector<int64_t> received(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    received[r] = matrix[r * size + rank];
    if (received[r] < 0 || received[r] > (int64_t{1} << 40)) return bad("a negative split");
    total += received[r];
  }
  out_shape[0] = total;
  Status status = task->AllocateOutput(out_shape);
  if (status.ok()) status = task->SetReceivedSplits(received);
  if (!status.ok()) return status;
  // One partition per receiving rank: it gathers every sender's rows for that rank.
  std::vector<PartitionTask> plan;
  size_t offset = 0;
  for (int owner = 0; owner < size; ++owner) {
    const size_t length = static_cast<size_t>(task->splits()[owner]) * row_bytes;
    PartitionTask item =
        Partition(task, static_cast<uint32_t>(owner) + 1, 0, task->source() + offset, length,
                  owner == rank ? static_cast<size_t>(total) * row_bytes : 0);
    item.owner = group.ranks[owner];
    plan.push_back(std::move(item));
    offset += length;
  }
  task->AddPartitions(static_cast<int>(plan.size()));
  for (PartitionTask& item : plan) LinkFor(task->tensor_id(), item.part).Enqueue(std::move(item));
  return Status::OK();
}

void Worker::OnTaskFinished(const std::string& name, OpKind kind, uint64_t tensor_id,
                            uint32_t round, const Status& status) {
  // Before the name is free again: the next round's pushes must follow the abandon.
  if (!status.ok()) {
    AbandonAtServers(tensor_id, round, kind);
    if (local_) local_->Abandon(tensor_id, round);
  }
  std::lock_guard<std::mutex> lock(registry_mutex_);
  auto it = registry_.find(name);
  if (it != registry_.end()) it->second.in_flight = false;
}

void Worker::Sample(const std::string& name, uint64_t tensor_id, uint32_t round, DataType dtype,
                    const char* stage, const void* data, size_t bytes) const {
  const std::string& wanted = options_.debug_sample;
  if (wanted.empty() || !data || (wanted != name && wanted != std::to_string(tensor_id))) return;
  BPS_LOG(kWarning) << "sample of tensor '" << name << "' (id " << tensor_id << ") round " << round
                    << ", " << stage << ": "
                    << SampleText(dtype, data, bytes / DataTypeSize(dtype));
}

void Worker::AbandonAtServers(uint64_t tensor_id, uint32_t round, OpKind kind) {
  for (auto& link : links_) link->Abandon(tensor_id, round, kind);
}

Status Worker::Join(int* last_rank) {
  {
    std::lock_guard<std::mutex> lock(join_mutex_);
    join_replies_ = 0;
    join_last_ = -1;
    join_rounds_.clear();
  }
  if (local_) local_->BeginJoin();
  for (auto& link : links_) link->SendJoin();
  std::unique_lock<std::mutex> lock(join_mutex_);
  const bool answered =
      join_cv_.wait_for(lock, std::chrono::milliseconds(options_.timeout_ms), [this] {
        return join_replies_ == static_cast<int>(links_.size()) || !fatal_error().ok() || stopping_;
      });
  Status fatal = fatal_error();
  if (!fatal.ok()) return fatal.WithSuffix(" (join)");
  if (stopping_) return Status::Error(ErrorKind::kShutdown, "tf_bps was shut down during join");
  if (!answered)
    return Status::Error(ErrorKind::kTimeout,
                         "join timed out after " + std::to_string(options_.timeout_ms / 1000) +
                             " s: not every worker joined (see BYTEPS_OP_TIMEOUT)");
  // Rounds that went on without this worker: catch up, so that its next operation on
  // those tensors meets the others' in the same round.
  {
    std::lock_guard<std::mutex> registry_lock(registry_mutex_);
    for (auto& [name, entry] : registry_) {
      auto found = join_rounds_.find(entry.id);
      if (found != join_rounds_.end()) entry.round = std::max(entry.round, found->second);
    }
    for (const auto& [tensor_id, round] : join_rounds_) {
      uint32_t& floor = round_floors_[tensor_id];
      floor = std::max(floor, round);
    }
  }
  if (local_) local_->EndJoin();
  *last_rank = join_last_;
  return Status::OK();
}

void Worker::OnJoined(int server, int last_rank,
                      const std::unordered_map<uint64_t, uint32_t>& rounds) {
  {
    std::lock_guard<std::mutex> lock(join_mutex_);
    // Servers may see joins in different orders; server 0's answer is the one given.
    if (server == 0 || join_last_ < 0) join_last_ = last_rank;
    for (const auto& [tensor_id, round] : rounds) {
      uint32_t& known = join_rounds_[tensor_id];
      known = std::max(known, round);
    }
    ++join_replies_;
  }
  join_cv_.notify_all();
}

void Worker::OnLinkFailure(const std::string& reason) {
  BPS_LOG(kError) << reason;
  Abort(reason);
}

void Worker::Abort(const std::string& reason) {
  start_cancel_.Cancel(reason);
  const Status status = Status::Error(ErrorKind::kPeerGone, reason);
  {
    std::lock_guard<std::mutex> lock(fatal_mutex_);
    if (fatal_.ok()) fatal_ = status;
  }
  for (auto& link : links_) link->FailPending(status);
  if (local_) local_->FailPending(status);
  join_cv_.notify_all();
}

void Worker::WatchdogLoop() {
  std::unique_lock<std::mutex> lock(watchdog_mutex_);
  while (!stopping_) {
    watchdog_cv_.wait_for(lock, std::chrono::milliseconds(250));
    if (stopping_) break;
    const auto now = std::chrono::steady_clock::now();
    for (auto& link : links_) link->FailExpired(now);
    if (local_) local_->FailExpired(now);
  }
}

void Worker::Stop() {
  if (stopping_.exchange(true)) return;
  { std::lock_guard<std::mutex> lock(watchdog_mutex_); }
  watchdog_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  for (auto& link : links_) link->Close(options_.rank);
  const Status shutdown =
      Status::Error(ErrorKind::kShutdown, "tf_bps was shut down while an operation was in flight");
  for (auto& link : links_) {
    link->Join();
    link->FailPending(shutdown);
  }
  if (local_) {
    local_->Close();
    local_->FailPending(shutdown);
  }
  if (timeline_) timeline_->Finish();  // A job that ended inside the window: written now.
  BPS_LOG(kInfo) << "worker " << options_.rank << " stopped";
}

}  // namespace bps
