#include "device_merge.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "../common/logging.h"
#include "device_staging.h"
#include "local_peers.h"

namespace bps {
namespace {

// A Ready's or a Go's text: a tensor's name and a device key, a failure, a group id.
constexpr size_t kMaxMergeText = 4096;
// What a peer can make this worker hold: Go's ahead of the one it applies next, and
// (local index 0) operations some workers are ready for and others not yet.
constexpr size_t kMaxPendingGos = 1 << 16;
constexpr size_t kMaxWaiting = 1 << 16;
constexpr uint8_t kReadyFailed = 1;  // a Ready's flag: the operation failed here

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string text;
  for (uint32_t rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

}  // namespace

DeviceMerge::DeviceMerge(Owner* owner, std::shared_ptr<Devices> devices,
                         std::vector<uint32_t> members, int index, int timeout_ms)
    : owner_(owner),
      devices_(std::move(devices)),
      members_(std::move(members)),
      index_(index),
      timeout_ms_(timeout_ms),
      numbered_(members_.size(), 0),
      joined_(members_.size(), false) {
  orderer_ = std::thread([this] { OrderLoop(); });
}

DeviceMerge::~DeviceMerge() { Close(); }

int DeviceMerge::LeaderOf(uint64_t tensor_id, uint32_t part) const {
  return LocalLeader(tensor_id, part, members_.size());
}

std::string DeviceMerge::DeviceKey(int device) const {
  const bps_device_api& api = devices_->api();
  if (!api.device_key) return "-the device table '" + std::string(api.name) + "' has no groups";
  char key[256] = {0};
  if (api.device_key(device, key, sizeof(key)) != 0) return "-" + std::string(api.last_error());
  return key;
}

void DeviceMerge::Submit(std::shared_ptr<Task> task, std::vector<PartitionTask> plan) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (on_host_ || !task->BeginIo()) {
      lock.unlock();
      owner_->RunOnHost(std::move(task), std::move(plan));
      return;
    }
  }
  auto op = std::make_shared<Operation>();
  op->task = task;
  for (const PartitionTask& item : plan)
    if (LeaderOf(task->tensor_id(), item.part) == index_) op->led.push_back(item);
  op->plan = std::move(plan);
  task->AddPartitions(1);  // the broadcast's: the task ends once every worker has its result
  std::weak_ptr<Operation> weak = op;
  task->staging()->set_on_answer([this, weak] { Answered(weak.lock()); });
  task->set_on_failure([this, weak](const Status& status) { Failed(weak.lock(), status); });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    operations_[Key{task->tensor_id(), task->round(), kReduce}] = op;
  }
  Ready(kReduce, task.get(), DeviceKey(task->spec().place.device));
}

void DeviceMerge::Ready(Phase phase, const Task* task, const std::string& text, bool failed) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kMergeReady);
  header.rank = members_[index_];
  header.part = phase;
  header.flags = failed ? kReadyFailed : 0;
  std::string name;
  if (task) {
    header.tensor_id = task->tensor_id();
    header.round = task->round();
    header.signature = task->signature();
    header.rows = static_cast<int64_t>(task->spec().bytes);
    header.dtype = static_cast<uint8_t>(task->dtype());
    name = task->name();
  }
  std::string payload = (name + '\n' + text).substr(0, kMaxMergeText);
  header.length = payload.size();
  if (index_ != 0) {
    Status status = owner_->SendToPeer(0, header, payload);
    // A broken link fails the worker (LocalMerge's peers report it); nothing to add.
    if (!status.ok()) BPS_LOG(kDebug) << "device merge: " << status.message();
    return;
  }
  std::vector<Send> sends;
  {
    std::lock_guard<std::mutex> lock(coordinator_mutex_);
    Arrived(0, header, name, text, &sends);
  }
  Deliver(sends);
}

Status DeviceMerge::OnFrame(int index, const FrameHeader& header, DataReader* payload) {
  const std::string peer = "worker rank " + std::to_string(members_[index]) + " on this host";
  if (header.length > kMaxMergeText)
    return Status::Error(peer + " sent an oversized device-merge frame");
  std::string text(header.length, '\0');
  Status status = payload->Read(text.data(), text.size());
  if (!status.ok()) return status;
  if (header.type == static_cast<uint8_t>(FrameType::kMergeReady)) {
    const size_t newline = text.find('\n');
    if (index_ != 0 || header.part > kJoinEnds || newline == std::string::npos)
      return Status::Error(peer + " sent a malformed device-merge ready");
    std::vector<Send> sends;
    {
      std::lock_guard<std::mutex> lock(coordinator_mutex_);
      if (waiting_.size() >= kMaxWaiting)
        return Status::Error(peer + " has more than " + std::to_string(kMaxWaiting) +
                             " operations waiting for the device merge");
      Arrived(index, header, text.substr(0, newline), text.substr(newline + 1), &sends);
    }
    Deliver(sends);
    return Status::OK();
  }
  if (index != 0 || header.part > kBroadcast || header.flags > kHostForGood || header.rows < 0 ||
      header.error_kind > static_cast<uint8_t>(ErrorKind::kShutdown))
    return Status::Error(peer + " sent a malformed device-merge go");
  Go go;
  go.key = Key{header.tensor_id, header.round, header.part};
  go.verdict = static_cast<Verdict>(header.flags);
  go.kind = static_cast<ErrorKind>(header.error_kind);
  go.text = std::move(text);
  go.sequence = static_cast<uint64_t>(header.rows);
  if (!Received(std::move(go)))
    return Status::Error(peer + " sent a device-merge go out of its numbering");
  return Status::OK();
}

void DeviceMerge::Arrived(int index, const FrameHeader& header, const std::string& name,
                          const std::string& text, std::vector<Send>* sends) {
  const auto phase = static_cast<Phase>(header.part);
  if (phase == kJoinBegins || phase == kJoinEnds) {
    joined_[index] = phase == kJoinBegins;
    // A worker that joined never comes: what waits for it merges on the host.
    for (auto& [key, waiting] : waiting_)
      if (!waiting.decided && std::get<2>(key) == kReduce && Complete(waiting))
        Decide(&waiting, sends);
    return;
  }
  const Key key{header.tensor_id, header.round, header.part};
  auto found = waiting_.find(key);
  if (found == waiting_.end()) {
    Waiting fresh;
    fresh.name = name;
    fresh.phase = phase;
    fresh.ready.assign(members_.size(), false);
    fresh.answered.assign(members_.size(), false);
    fresh.texts.assign(members_.size(), std::string());
    fresh.signature = header.signature;
    fresh.bytes = header.rows;
    fresh.dtype = header.dtype;
    fresh.round = header.round;
    fresh.since = Clock::now();
    fresh.go.key = key;
    fresh.first = index;
    found = waiting_.emplace(key, std::move(fresh)).first;
  }
  Waiting& waiting = found->second;
  if (waiting.ready[index]) return;
  waiting.ready[index] = true;
  waiting.texts[index] = text;
  if (header.signature != waiting.signature || header.rows != waiting.bytes ||
      header.dtype != waiting.dtype)
    if (waiting.mismatched < 0) waiting.mismatched = index;
  if ((header.flags & kReadyFailed) && waiting.failed < 0) waiting.failed = index;
  if (waiting.decided) {
    Answer(index, &waiting, sends);  // late: the others had their answer
  } else if ((phase == kReduce && mode_ == Mode::kHost) || Complete(waiting)) {
    const bool undecided = mode_ == Mode::kUndecided;
    Decide(&waiting, sends);
    // Once on the host, workers no longer ask: what waits for them is answered now.
    if (undecided && mode_ == Mode::kHost)
      for (auto& [other, pending] : waiting_)
        if (!pending.decided && pending.phase == kReduce) Decide(&pending, sends);
  }
  Forget(found);
}

bool DeviceMerge::Complete(const Waiting& waiting) const {
  for (size_t i = 0; i < members_.size(); ++i)
    if (!waiting.ready[i] && !(waiting.phase == kReduce && joined_[i])) return false;
  return true;
}

void DeviceMerge::Forget(std::map<Key, Waiting>::iterator found) {
  for (bool answered : found->second.answered)
    if (!answered) return;
  waiting_.erase(found);
}

std::string DeviceMerge::ChooseMerge(const Waiting& waiting) const {
  for (size_t i = 0; i < members_.size(); ++i)
    if (!waiting.texts[i].empty() && waiting.texts[i][0] == '-')
      return "worker rank " + std::to_string(members_[i]) + " has no collectives: " +
             waiting.texts[i].substr(1);
  for (size_t i = 0; i < members_.size(); ++i)
    for (size_t j = i + 1; j < members_.size(); ++j)
      if (waiting.texts[i] == waiting.texts[j])
        return "worker ranks " + std::to_string(members_[i]) + " and " +
               std::to_string(members_[j]) + " share one device (" + waiting.texts[i] +
               "), and the collectives need a device per worker";
  return "";
}

void DeviceMerge::Decide(Waiting* waiting, std::vector<Send>* sends) {
  Go& go = waiting->go;
  const std::string tensor = "tensor '" + waiting->name + "' (round " +
                             std::to_string(waiting->round) + ")";
  const bool anyone_joined = std::find(joined_.begin(), joined_.end(), true) != joined_.end();
  if (waiting->phase == kBroadcast) {
    go.verdict = waiting->failed < 0 ? kGroup : kFail;
    if (waiting->failed >= 0)
      go.text = "worker rank " + std::to_string(members_[waiting->failed]) + " failed " + tensor +
                ": " + waiting->texts[waiting->failed];
  } else if (waiting->mismatched >= 0) {
    go.verdict = kFail;
    go.kind = ErrorKind::kMismatch;
    const auto [one, other] = std::minmax(members_[waiting->first],
                                          members_[waiting->mismatched]);
    go.text = "worker ranks " + std::to_string(one) + " and " + std::to_string(other) +
              " of this host disagree on " + tensor +
              ": a different shape, data type or operation";
  } else if (mode_ == Mode::kUndecided && !anyone_joined) {
    host_reason_ = ChooseMerge(*waiting);
    if (host_reason_.empty()) {
      mode_ = Mode::kGroup;
      group_keys_ = waiting->texts;
      go.verdict = kOpenGroup;
      go.text.assign(BPS_GROUP_ID_BYTES, '\0');
      if (devices_->api().group_id(go.text.data()) != 0) {
        mode_ = Mode::kHost;
        host_reason_ = std::string("no group id: ") + devices_->api().last_error();
      } else {
        BPS_LOG(kInfo) << "device tensors of worker ranks " << RankList(members_)
                       << " merge on their devices (" << devices_->api().name
                       << " collectives)";
      }
    } else {
      mode_ = Mode::kHost;
    }
    if (mode_ == Mode::kHost) {
      BPS_LOG(kInfo) << "device tensors of worker ranks " << RankList(members_)
                     << " merge on the host: " << host_reason_;
      go.verdict = kHostForGood;
      go.text = host_reason_;
    }
  } else if (mode_ == Mode::kHost) {
    go.verdict = kHostForGood;
    go.text = host_reason_;
  } else if (anyone_joined || waiting->texts != group_keys_ ||
             !devices_->api().group_has_dtype(waiting->dtype)) {
    go.verdict = kHost;  // during a join, on another device, or a type NCCL lacks
  } else {
    go.verdict = kGroup;
  }
  waiting->decided = true;
  for (size_t i = 0; i < members_.size(); ++i)
    if (waiting->ready[i]) Answer(static_cast<int>(i), waiting, sends);
}

void DeviceMerge::Answer(int index, Waiting* waiting, std::vector<Send>* sends) {
  waiting->answered[index] = true;
  Go go = waiting->go;
  go.sequence = numbered_[index]++;
  sends->push_back({index, std::move(go)});
}

void DeviceMerge::Deliver(const std::vector<Send>& sends) {
  for (const Send& send : sends) {
    if (send.member == index_) {
      Received(send.go);
      continue;
    }
    FrameHeader header;
    header.type = static_cast<uint8_t>(FrameType::kMergeGo);
    header.rank = members_[index_];
    header.tensor_id = std::get<0>(send.go.key);
    header.round = std::get<1>(send.go.key);
    header.part = std::get<2>(send.go.key);
    header.flags = send.go.verdict;
    header.error_kind = static_cast<uint8_t>(send.go.kind);
    header.rows = static_cast<int64_t>(send.go.sequence);
    header.length = send.go.text.size();
    Status status = owner_->SendToPeer(send.member, header, send.go.text);
    if (!status.ok()) BPS_LOG(kDebug) << "device merge: " << status.message();
  }
}

bool DeviceMerge::Received(Go go) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (go.sequence < next_go_ || go.sequence - next_go_ >= kMaxPendingGos ||
        gos_.count(go.sequence) > 0)
      return false;
    if (go.verdict == kHostForGood && !on_host_) {
      on_host_ = true;
      if (index_ != 0) BPS_LOG(kInfo) << "device tensors merge on the host: " << go.text;
    }
    const uint64_t sequence = go.sequence;
    gos_.emplace(sequence, std::move(go));
  }
  go_arrived_.notify_all();
  return true;
}

void DeviceMerge::OrderLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    go_arrived_.wait(lock, [this] { return closing_ || gos_.count(next_go_) > 0; });
    if (closing_) return;
    Go go = std::move(gos_[next_go_]);
    gos_.erase(next_go_++);
    lock.unlock();
    Apply(go);
    lock.lock();
  }
}

std::shared_ptr<DeviceMerge::Operation> DeviceMerge::Find(const Key& key, bool take) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = operations_.find(Key{std::get<0>(key), std::get<1>(key), kReduce});
  if (found == operations_.end()) return nullptr;
  std::shared_ptr<Operation> op = found->second;
  if (take) operations_.erase(found);
  return op;
}

void DeviceMerge::Apply(const Go& go) {
  const bool collective = go.verdict == kGroup || go.verdict == kOpenGroup;
  std::shared_ptr<Operation> op = Find(go.key, !collective);
  if (!op) {
    // Failed here meanwhile (FailPending): the group is being closed anyway.
    if (collective) BPS_LOG(kWarning) << "device merge: an operation left before its collective";
    return;
  }
  Task& task = *op->task;
  if (!collective) {
    task.staging()->set_on_answer(nullptr);
    task.PartitionDone();  // the broadcast's, which does not happen
    if (go.verdict == kFail) {
      if (std::get<2>(go.key) == kReduce) owner_->AbandonPushes(task, op->led);
      task.Fail(Status::Error(go.kind, go.text));
    } else {
      owner_->RunOnHost(op->task, std::move(op->plan));
    }
    task.EndIo();
    return;
  }
  Status status = go.verdict == kOpenGroup ? OpenGroup(task, go.text) : Status::OK();
  const bool reduce = std::get<2>(go.key) == kReduce;
  if (status.ok()) status = reduce ? QueueReduce(op) : QueueBroadcast(op);
  if (status.ok()) return;
  status = status.WithSuffix(" (tensor '" + task.name() + "')");
  bool tell = false;
  if (reduce) {
    std::lock_guard<std::mutex> lock(mutex_);
    tell = !op->told_ready;
    op->told_ready = true;
  }
  // The others skip the broadcast too, and fail the operation with this reason.
  if (tell) Ready(kBroadcast, &task, status.message(), true);
  Finish(op, status);
}

Status DeviceMerge::OpenGroup(const Task& task, const std::string& id) {
  const bps_device_api& api = devices_->api();
  device_ = task.spec().place.device;
  if (api.stream_create(device_, &stream_) != 0)
    return devices_->Failure("cannot make the local merge's stream", device_);
  void* group = nullptr;
  if (api.group_open(device_, id.data(), static_cast<int>(members_.size()), index_, &group) != 0)
    return devices_->Failure("cannot open the local merge's group", device_);
  std::lock_guard<std::mutex> lock(mutex_);
  group_ = group;
  return Status::OK();
}

Status DeviceMerge::Collectives(const Operation& op, bool reduce) {
  const bps_device_api& api = devices_->api();
  const Task& task = *op.task;
  DeviceStaging& staging = *task.staging();
  const size_t element = DataTypeSize(task.dtype());
  const int dtype = static_cast<int>(task.dtype());
  if (!group_) return Status::Error("the local merge's group did not open");
  if (api.group_begin() != 0) return devices_->Failure("the collectives cannot begin", device_);
  int failed = 0;
  for (const PartitionTask& item : op.plan) {
    const int root = LeaderOf(task.tensor_id(), item.part);
    char* output = staging.device_output() + item.offset;
    const size_t count = item.reply_length / element;
    failed |= reduce ? api.group_reduce(device_, staging.device_input() + item.offset, output,
                                        count, dtype, static_cast<int>(task.op().reduce_op),
                                        root, group_, stream_)
                     : api.group_broadcast(device_, output, count, dtype, root, group_, stream_);
  }
  failed |= api.group_end();
  if (failed) return devices_->Failure("cannot queue the local merge's collectives", device_);
  return Status::OK();
}

Status DeviceMerge::QueueReduce(const std::shared_ptr<Operation>& op) {
  Task& task = *op->task;
  if (devices_->api().stream_wait(device_, stream_, task.spec().place.stream) != 0)
    return devices_->Failure("the local merge's stream cannot wait for the caller's", device_);
  Status status = Collectives(*op, true);
  if (!status.ok()) return status;  // Apply tells the others
  bool tell_failed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op->reduced = true;
    if (task.failed() && !op->told_ready) tell_failed = op->told_ready = true;
  }
  if (tell_failed) {
    owner_->AbandonPushes(task, op->led);
    Ready(kBroadcast, &task, "failed before its collectives ran", true);
    return Status::OK();
  }
  std::vector<PartitionTask> led = op->led;
  for (PartitionTask& item : led) item.flags |= kFlagHostMerged;
  DeviceStaging::Route route;
  route.send = [this](PartitionTask item) { owner_->SendToServer(std::move(item)); };
  route.drop = [this](const PartitionTask& item) { owner_->AbandonPushes(*item.task, {item}); };
  route.check = [this, task = op->task.get()](const char* data, size_t bytes) {
    return owner_->CheckFinite(*task, data, bytes);
  };
  status = task.staging()->StageSums(op->task, std::move(led), stream_, std::move(route));
  if (!status.ok()) task.Fail(status.WithSuffix(" (tensor '" + task.name() + "')"));
  if (op->led.empty()) Answered(op);
  return Status::OK();
}

Status DeviceMerge::QueueBroadcast(const std::shared_ptr<Operation>& op) {
  const bps_device_api& api = devices_->api();
  void* engine = nullptr;
  Status status = devices_->Stream(device_, &engine);
  if (status.ok() && api.stream_wait(device_, stream_, engine) != 0)
    status = devices_->Failure("the local merge's stream cannot wait for the engine's", device_);
  if (status.ok()) status = Collectives(*op, false);
  if (status.ok() && api.stream_wait(device_, engine, stream_) != 0)
    status = devices_->Failure("the engine's stream cannot wait for the local merge's", device_);
  if (status.ok())
    status = devices_->WhenDone(device_, [this, op] {
      Status result = Status::OK();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (group_ && devices_->api().group_check(device_, group_) != 0)
          result = devices_->Failure("the local merge's collectives failed", device_);
      }
      Finish(op, result.WithSuffix(" (tensor '" + op->task->name() + "')"));
    });
  return status;
}

void DeviceMerge::Answered(const std::shared_ptr<Operation>& op) {
  if (!op) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (op->told_ready || ++op->answered < op->led.size()) return;
    op->told_ready = true;
  }
  Ready(kBroadcast, op->task.get(), "");
}

void DeviceMerge::Failed(const std::shared_ptr<Operation>& op, const Status& status) {
  if (!op) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!op->reduced || op->told_ready) return;  // QueueReduce tells it
    op->told_ready = true;
  }
  Ready(kBroadcast, op->task.get(), status.message(), true);
}

void DeviceMerge::Finish(const std::shared_ptr<Operation>& op, const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (op->finished) return;
    op->finished = true;
    operations_.erase(Key{op->task->tensor_id(), op->task->round(), kReduce});
  }
  Task& task = *op->task;
  task.staging()->set_on_answer(nullptr);
  if (!status.ok()) task.Fail(status);
  for (const PartitionTask& item : op->plan)
    if (LeaderOf(task.tensor_id(), item.part) != index_) task.PartitionDone();
  task.PartitionDone();  // the broadcast's
  task.EndIo();
}

void DeviceMerge::FailExpired(Clock::time_point now) {
  if (index_ != 0) return;  // index 0 gives up for everyone
  std::vector<Send> sends;
  {
    std::lock_guard<std::mutex> lock(coordinator_mutex_);
    const auto limit = std::chrono::milliseconds(timeout_ms_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Waiting& waiting = it->second;
      if (waiting.decided) {
        // A worker that never came: its late answer is not wanted any more.
        it = now - waiting.since > 2 * limit ? waiting_.erase(it) : std::next(it);
        continue;
      }
      if (now - waiting.since < limit) {
        ++it;
        continue;
      }
      std::vector<uint32_t> missing;
      for (size_t i = 0; i < members_.size(); ++i)
        if (!waiting.ready[i]) missing.push_back(members_[i]);
      waiting.go.verdict = kFail;
      waiting.go.kind = ErrorKind::kTimeout;
      waiting.go.text = "worker rank(s) " + RankList(missing) + " of this host did not reach " +
                        "tensor '" + waiting.name + "' (round " + std::to_string(waiting.round) +
                        ") within " + std::to_string(timeout_ms_ / 1000) + " s";
      waiting.decided = true;
      for (size_t i = 0; i < members_.size(); ++i)
        if (waiting.ready[i]) Answer(static_cast<int>(i), &waiting, &sends);
      ++it;
    }
  }
  Deliver(sends);
}

void DeviceMerge::FailPending(const Status& reason) {
  std::vector<std::shared_ptr<Operation>> open;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, op] : operations_) open.push_back(op);
    operations_.clear();
  }
  for (auto& op : open) {
    if (!op->reduced) {
      owner_->AbandonPushes(*op->task, op->led);
      Finish(op, reason);
      continue;
    }
    // Its collectives may still run on its memory: it ends once they have (or once
    // Close aborts them).
    void* engine = nullptr;
    Status status = devices_->Stream(device_, &engine);
    if (status.ok() && devices_->api().stream_wait(device_, engine, stream_) != 0)
      status = devices_->Failure("cannot wait for the local merge", device_);
    if (status.ok())
      status = devices_->WhenDone(device_, [this, op, reason] { Finish(op, reason); });
    if (!status.ok()) Finish(op, reason);
  }
}

void DeviceMerge::Close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_) return;
    closing_ = true;
  }
  go_arrived_.notify_all();
  if (orderer_.joinable()) orderer_.join();
  void* group = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::swap(group, group_);
  }
  // Aborted: a member may be gone, and what is still queued must end without it.
  if (group) devices_->api().group_close(device_, group, 1);
  if (stream_) devices_->api().stream_destroy(device_, stream_);
}

}  // namespace bps
