#include "worker.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "../common/logging.h"
#include "../common/reduce.h"
#include "device_staging.h"
#include "op_policy.h"

namespace bps {
namespace {

// The credit counts partitions of BYTEPS_PARTITION_BYTES. Across hosts, tensors are
// cut into pieces of kNetworkPartitionBytes (EvenPartitionBytes); the credit shrinks
// with them, so that as many pieces, not as many bytes, are in flight: a deep queue at
// a link delays every sum behind it (examples/benchmarks/network_bound.py).
// Flows queued at one link share it by the bytes each has queued there, so a server
// with a larger share of the partitions (server_shares.py) gets as much more in flight.
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

// ---------------------------------------------------------------------------
// Worker

Worker::Worker(WorkerOptions options)
    : options_(std::move(options)),
      routes_(ServerCycle(options_.server_shares, options_.servers.size()),
              options_.servers.size()),
      push_window_(PushWindow(options_)) {}

Worker::~Worker() { Stop(); }

void Worker::SetLearningRate(double rate) {
  const double was = learning_rate_.exchange(rate, std::memory_order_relaxed);
  if (was != rate)
    BPS_LOG(kDebug) << "learning rate " << rate << " (was " << was
                    << "): error feedback rescales by the change";
}

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
    Status status =
        ConnectToServer(address, peer, JobSecret(options_.token, options_.encrypt), options_.rank,
                        options_.timeout_ms, &channel, &start_cancel_, slots_, options_.generation);
    if (status.kind() == ErrorKind::kAborted) return status;  // The job's abort, as it came.
    if (!status.ok())
      return Status::Error(ErrorKind::kPeerGone, "worker " + std::to_string(options_.rank) +
                                                     " cannot reach " + peer + ": " +
                                                     status.message());
    links_.push_back(std::make_unique<ServerLink>(
        this, options_.rank, static_cast<int>(i), address, std::move(channel),
        CreditBytes(options_, static_cast<int>(i)), push_window_));
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
    if (options_.devices) {
      const auto& ranks = options_.local_ranks;
      const auto index = std::find(ranks.begin(), ranks.end(), options_.rank) - ranks.begin();
      device_merge_ = std::make_unique<DeviceMerge>(
          this, options_.devices, std::vector<uint32_t>(ranks.begin(), ranks.end()),
          static_cast<int>(index), options_.timeout_ms);
      local_->set_merge_frames([merge = device_merge_.get()](int peer, const FrameHeader& header,
                                                             DataReader* payload) {
        return merge->OnFrame(peer, header, payload);
      });
    }
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

void Worker::Declare(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(registry_mutex_);
  for (const std::string& name : names) EntryLocked(name);
}

Status Worker::Admit(TaskSpec* spec, AllocateFn* allocate, Group* group,
                     std::shared_ptr<DeviceStaging>* staging) {
  const std::string& name = spec->op.name;
  Status status = fatal_error();
  if (!status.ok()) return status.WithSuffix(" (tensor '" + name + "')");
  if (stopping_)
    return Status::Error(ErrorKind::kShutdown,
                         "tf_bps is shut down; cannot run tensor '" + name + "'");
  status = GroupOf(spec->op, group);
  if (status.ok()) status = CheckTaskSpec(*spec, *group);
  if (!status.ok()) return status;
  ChooseWireKind(options_.min_compress_bytes, &spec->op);
  if (spec->op.kind == OpKind::kAlltoall && spec->splits.empty())
    spec->splits.assign(group->size(), spec->op.shape[0] / group->size());
  if (!spec->place.on_device()) return Status::OK();
  if (!options_.devices)
    return Status::Error(ErrorKind::kInvalidArgument,
                         "tensor '" + name +
                             "' is in device memory, and no device library is loaded "
                             "(bps_device_use)");
  return DeviceStaging::Prepare(options_.devices, spec, allocate, staging);
}

Status Worker::NextRound(const std::string& name, TensorEntry* entry) {
  std::lock_guard<std::mutex> lock(registry_mutex_);
  TensorEntry& known = EntryLocked(name);
  if (known.in_flight)
    return Status::Error(
        ErrorKind::kInvalidArgument,
        "tensor '" + name + "' is already in flight; concurrent operations need distinct names");
  known.in_flight = true;
  ++known.round;
  *entry = known;
  return Status::OK();
}

std::shared_ptr<Task> Worker::MakeTask(TaskSpec spec, Group group, const TensorEntry& entry,
                                       AllocateFn allocate,
                                       std::shared_ptr<DeviceStaging> staging, DoneFn done) {
  const std::string name = spec.op.name;
  // The operation's whole time, queues included, if a timeline recording takes it.
  const uint32_t traced = timeline_->OperationStarted(entry.round);
  const int64_t traced_from = traced ? Timeline::Now() : 0;
  const OpKind kind = spec.op.kind;
  // The result's size is known here only where it is the input's.
  const DataType dtype = spec.op.dtype;
  const size_t result_bytes = OpPolicyFor(kind).OutputIsInputSized() ? spec.bytes : 0;
  void* const result = spec.output;
  const size_t input_bytes = spec.bytes;
  const auto started = WorkerStats::Clock::now();
  auto task = std::make_shared<Task>(
      std::move(spec), std::move(group), entry.id, entry.order, entry.round, options_.timeout_ms,
      std::move(allocate),
      [this, name, kind, dtype, result, result_bytes, input_bytes, started, id = entry.id,
       round = entry.round, traced, traced_from, staging, done = std::move(done)](Status status) {
        if (traced) timeline_->OperationEnded(traced, name, round, traced_from);
        if (status.ok()) Sample(name, id, round, dtype, "result", result, result_bytes);
        if (staging) {
          if (!status.ok()) staging->Refuse();
          Status finished = staging->Finish();
          if (status.ok()) status = finished.WithSuffix(" (tensor '" + name + "')");
        }
        const bool reduction = IsPushPull(kind) || kind == OpKind::kAsyncPushPull;
        options_.stats->OperationEnded(reduction, status.ok(), id, input_bytes,
                                       WorkerStats::Clock::now() - started);
        OnTaskFinished(name, kind, id, round, status);
        if (staging) staged_.Ended(staging.get());
        done(status);
      });
  task->set_trace_session(traced);  // before any stage sees the task
  task->set_learning_rate(learning_rate_.load(std::memory_order_relaxed));
  task->set_staging(staging);
  if (staging) staged_.Began(staging.get(), task);
  return task;
}

void Worker::Enqueue(TaskSpec spec, AllocateFn allocate, DoneFn done) {
  const std::string name = spec.op.name;
  Group group;
  std::shared_ptr<DeviceStaging> staging;
  TensorEntry entry;
  Status status = Admit(&spec, &allocate, &group, &staging);
  if (status.ok()) status = NextRound(name, &entry);
  if (!status.ok()) {
    done(status);
    return;
  }
  const OpKind kind = spec.op.kind;
  const DataType dtype = spec.op.dtype;
  std::shared_ptr<Task> task = MakeTask(std::move(spec), std::move(group), entry,
                                        std::move(allocate), staging, std::move(done));
  std::vector<PartitionTask> plan;
  status = Plan(task, &plan);
  if (status.ok()) {
    // A device tensor's pieces are checked as they reach the host (DeviceStaging).
    if (!staging) status = CheckFinite(*task, task->spec().input, task->spec().bytes);
    if (!status.ok()) AbandonUnsent(*task, plan);
  }
  if (!status.ok()) {
    // Failed first: launched with nothing to wait for, it would otherwise complete.
    task->Fail(status);
    task->Launch(0);
    return;
  }
  if (!staging)
    Sample(name, task->tensor_id(), task->round(), dtype, "pushed", task->source(),
           IsGather(kind) ? 0 : task->spec().bytes);
  task->Launch(static_cast<int>(plan.size()));
  const bool merged = local_ && local_->Merges(*task);
  if (local_ && !merged) local_->Announce(task);
  if (staging && merged && device_merge_)
    return device_merge_->Submit(std::move(task), std::move(plan));
  RunOnHost(std::move(task), std::move(plan));
}

void Worker::RunOnHost(std::shared_ptr<Task> task, std::vector<PartitionTask> plan) {
  const bool merged = local_ && local_->Merges(*task);
  DeviceStaging* staging = task->staging();
  const OpKind kind = task->kind();
  if (staging) {
    DeviceStaging::Route route;
    route.send = [this, merged](PartitionTask item) { Forward(std::move(item), merged); };
    route.drop = [this](const PartitionTask& item) { AbandonUnsent(*item.task, {item}); };
    if (options_.nan_check)
      route.check = [this, task = task.get()](const char* data, size_t bytes) {
        return CheckFinite(*task, data, bytes);
      };
    Status status =
        staging->StageInput(task, OpPolicyFor(kind).PieceBytes(task->spec(), Setup()),
                            task->trace_session() ? timeline_.get() : nullptr, std::move(route));
    if (!status.ok()) {
      AbandonUnsent(*task, plan);
      task->Fail(status.WithSuffix(" (tensor '" + task->name() + "')"));
      return;
    }
  }
  for (PartitionTask& item : plan) Dispatch(std::move(item), merged);
}

void Worker::Dispatch(PartitionTask item, bool merged) {
  if (DeviceStaging* staging = item.task->staging()) return staging->Release(std::move(item));
  Forward(std::move(item), merged);
}

void Worker::Forward(PartitionTask item, bool merged) {
  if (merged) return local_->Contribute(std::move(item));
  SendToServer(std::move(item));
}

Status Worker::CheckFinite(const Task& task, const void* data, size_t bytes) const {
  const bool sums = IsReduction(task.kind()) || task.kind() == OpKind::kAsyncPushPull;
  if (!options_.nan_check || !sums ||
      AllFinite(task.dtype(), data, bytes / DataTypeSize(task.dtype())))
    return Status::OK();
  return Status::Error(ErrorKind::kInvalidArgument,
                       "tensor '" + task.name() + "' holds NaN or Inf on worker rank " +
                           std::to_string(options_.rank) + " at step " +
                           std::to_string(task.round()) + " (PERSEUS_ALLREDUCE_NANCHECK=1)");
}

void Worker::AbandonPushes(const Task& task, const std::vector<PartitionTask>& plan) {
  for (const PartitionTask& item : plan)
    LinkFor(task.tensor_id(), item.part)
        .AbandonUnsent(task.tensor_id(), task.round(), item.part, task.kind());
}

Status Worker::SendToPeer(int index, const FrameHeader& header, const std::string& payload) {
  return local_->SendToPeer(index, header, payload);
}

void Worker::AbandonUnsent(const Task& task, const std::vector<PartitionTask>& plan) {
  const bool merged = local_ && local_->Merges(task);
  for (const PartitionTask& item : plan) {
    LinkFor(task.tensor_id(), item.part)
        .AbandonUnsent(task.tensor_id(), task.round(), item.part, task.kind());
    if (merged) local_->AbandonUnsent(task, item.part);
  }
}

ServerLink& Worker::LinkFor(uint64_t tensor_id, uint32_t part) {
  return *links_[routes_.For(tensor_id, part)];
}

void Worker::SendToServer(PartitionTask partition) {
  // A link retired meanwhile hands it back; the routes already lead past it.
  while (!LinkFor(partition.task->tensor_id(), partition.part).Enqueue(partition)) {
  }
}

PlanSetup Worker::Setup() const {
  PlanSetup setup;
  setup.rank = options_.rank;
  setup.partition_bytes = options_.partition_bytes;
  setup.spread = routes_.cycle_length();
  setup.across_hosts = options_.across_hosts;
  return setup;
}

Status Worker::Plan(const std::shared_ptr<Task>& task, std::vector<PartitionTask>* plan) {
  const TaskSpec& spec = task->spec();
  const Declaration& op = spec.op;
  const OpPolicy& policy = OpPolicyFor(op.kind);
  // A device tensor is prescaled piece by piece as it reaches the host (DeviceStaging).
  if (IsReduction(op.kind) && op.prescale != 1.0 && !task->staging()) {
    // Scale a copy: the input belongs to the framework. An output of the input's size
    // is ours until the task completes, and each partition's result arrives after its
    // push; a smaller one cannot hold the copy.
    char* copy = static_cast<char*>(spec.output);
    if (!policy.OutputIsInputSized()) {
      task->scratch().resize(spec.bytes);
      copy = task->scratch().data();
    }
    if (copy != spec.input) std::memcpy(copy, spec.input, spec.bytes);
    ScaleInPlace(op.dtype, copy, spec.bytes / DataTypeSize(op.dtype), op.prescale);
    task->set_source(copy);
  }
  return policy.Plan(task, Setup(), plan);
}

Status Worker::StartGatherData(const std::shared_ptr<Task>& task, const std::vector<char>& sizes) {
  const Declaration& op = task->op();
  const int size = task->group().size();
  // The reply: each worker's row count, then (alltoall) the matrix of splits.
  std::vector<int64_t> table(sizes.size() / sizeof(int64_t));
  std::memcpy(table.data(), sizes.data(), table.size() * sizeof(int64_t));
  auto bad = [&](const std::string& what) {
    return Status::Error(ErrorKind::kInternal, "a server sent " + what + " in " +
                                                   OpKindName(op.kind) + " of tensor '" +
                                                   op.name + "'");
  };
  const size_t entries = size + (op.kind == OpKind::kAlltoall ? size * size : 0);
  if (table.size() != entries) return bad("a malformed size table");
  for (int64_t count : table) {
    // Bounded so that the sums the policies make cannot overflow whatever a server sends.
    if (count < 0 || count > (int64_t{1} << 40))
      return bad("a row count of " + std::to_string(count));
  }
  if (table[task->group().index] != op.shape[0]) return bad("another row count for this worker");
  std::vector<PartitionTask> plan;
  Status status = OpPolicyFor(op.kind).PlanRows(task, table, Setup(), &plan);
  if (!status.ok()) return status;
  task->AddPartitions(static_cast<int>(plan.size()));
  for (PartitionTask& item : plan) Dispatch(std::move(item), false);
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

void Worker::OnStall(uint64_t tensor_id, const std::string& warning) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(stalls_mutex_);
    auto& logged = stalls_logged_[tensor_id];
    if (logged.time_since_epoch().count() != 0 && now - logged < std::chrono::seconds(1)) return;
    logged = now;
  }
  BPS_LOG(kWarning) << "worker rank " << options_.rank << ": stalled: " << warning;
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
  if (device_merge_) device_merge_->FailPending(status);
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
    if (device_merge_) device_merge_->FailExpired(now);
    CheckLostServers(now);
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
  if (device_merge_) {
    // Aborting the group ends collectives that wait for workers gone.
    device_merge_->FailPending(shutdown);
    device_merge_->Close();
  }
  // Tasks on device memory may wait for their pieces rather than for a link: they
  // end here too, once the engine's copies of their memory ran.
  staged_.FailAll(shutdown, std::chrono::milliseconds(options_.timeout_ms));
  timeline_->Finish();  // A job that ended while recording: its files are written now.
  BPS_LOG(kInfo) << "worker " << options_.rank << " stopped";
}

}  // namespace bps
