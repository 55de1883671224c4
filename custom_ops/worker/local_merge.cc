#include "local_merge.h"

#include <algorithm>
#include <cstring>

#include "../common/logging.h"
#include "device_staging.h"

namespace bps {
namespace {

constexpr size_t kMaxDeclarationBytes = 1u << 20;

}  // namespace

bool LocalMerge::MergesOp(const Declaration& op) {
  return IsPushPull(op.kind) && op.process_set == 0 && DeclaredBytes(op) > 0;
}

LocalMerge::LocalMerge(Owner* owner, LocalMergeOptions options, std::shared_ptr<SharedSlots> slots)
    : owner_(owner),
      options_(std::move(options)),
      slots_(std::move(slots)),
      peers_(options_, slots_) {}

LocalMerge::~LocalMerge() { Close(); }

// ---------------------------------------------------------------------------
// Connecting

Status LocalMerge::Start(Cancellation* cancel) {
  const auto& ranks = options_.ranks;
  index_ = static_cast<int>(std::find(ranks.begin(), ranks.end(), options_.rank) - ranks.begin());
  if (index_ == static_cast<int>(ranks.size()))
    return Status::Error(
        ErrorKind::kInvalidArgument,
        "worker rank " + std::to_string(options_.rank) + " is not among the workers of its host");
  members_.assign(ranks.begin(), ranks.end());
  joined_epoch_.assign(ranks.size(), -1);
  finished_.assign(ranks.size(), false);
  Status status = peers_.Connect(index_, cancel);
  if (!status.ok()) return status;
  push_stage_.Start([this](PartitionTask& partition) { return SendToLeader(partition); });
  peers_.StartReceiving(this);
  BPS_LOG(kDebug) << "worker rank " << options_.rank << " merges with " << ranks.size() - 1
                  << " other worker(s) of its host";
  return Status::OK();
}

int LocalMerge::LeaderOf(uint64_t tensor_id, uint32_t part) const {
  return LocalLeader(tensor_id, part, options_.ranks.size());
}

bool LocalMerge::Merges(const Task& task) const { return MergesOp(task.op()); }

void LocalMerge::Announce(const std::shared_ptr<Task>& task) {
  Effects effects;
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    declarations_.Put(task->tensor_id(), own_rank(), task->op(), task->round());
    announced_[task->tensor_id()] = task;
    CheckAgreement(task->tensor_id(), index_, &effects);
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (!peers_.peer(i)) continue;
      Effects::Message& declare = Queue(&effects, static_cast<int>(i), FrameType::kDeclare,
                                        PartitionKey{task->tensor_id(), 0}, task->round());
      declare.header.length = task->declaration_frame().size();
      declare.payload = task->declaration_frame();
    }
  }
  Run(effects);
}

int LocalMerge::IndexOf(uint32_t rank) const {
  return static_cast<int>(std::lower_bound(members_.begin(), members_.end(), rank) -
                          members_.begin());
}

// ---------------------------------------------------------------------------
// Contributions

Timeline* LocalMerge::TracerFor(const Task& task) const {
  return task.trace_session() ? owner_->timeline() : nullptr;
}

void LocalMerge::Contribute(PartitionTask partition) {
  if (TracerFor(*partition.task)) partition.queued_at = Timeline::Now();
  const PartitionKey key{partition.task->tensor_id(), partition.part};
  const int leader = LeaderOf(key.tensor_id, key.part);
  Effects effects;
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    partition.join_epoch = epoch_;
    if (leader != index_) {
      pending_.Add(PendingPartition::Of(partition, leader));
    } else {
      const Task& task = *partition.task;
      FrameHeader push;
      push.tensor_id = key.tensor_id;
      push.part = key.part;
      push.round = task.round();
      push.join_epoch = epoch_;
      push.signature = task.signature();
      push.length = partition.push_length;
      Arrive(index_, push, partition.data, &partition, &effects);
    }
  }
  if (leader != index_) {
    push_stage_.Push(std::move(partition));
  } else {
    Run(effects);
  }
}

void LocalMerge::MarkSent(const PartitionTask& partition, int64_t at) {
  pending_.Update(partition.task, partition.part,
                  [at](PendingPartition& pending) { pending.sent_at = at; });
}

bool LocalMerge::SendToLeader(PartitionTask& partition) {
  Task& task = *partition.task;
  LocalPeers::Peer& peer = *peers_.peer(LeaderOf(task.tensor_id(), partition.part));
  if (!task.BeginIo()) return true;  // Failed meanwhile: nothing to send.
  Timeline* const tracer = TracerFor(task);
  // The leader's result may come back before this thread notes when the push ended:
  // BROADCAST then counts from when it began.
  if (tracer) MarkSent(partition, Timeline::Now());
  FrameHeader header;
  header.rank = static_cast<uint32_t>(options_.rank);
  header.tensor_id = task.tensor_id();
  Status status = Status::OK();
  uint64_t& declared = peer.declared[task.tensor_id()];
  if (declared != task.declaration_hash()) {
    header.type = static_cast<uint8_t>(FrameType::kDeclare);
    header.round = task.round();
    header.length = task.declaration_frame().size();
    status = peer.channel->Send(header, task.declaration_frame().data());
    if (status.ok()) declared = task.declaration_hash();
  }
  if (status.ok()) {
    header.type = static_cast<uint8_t>(FrameType::kPush);
    header.op_kind = static_cast<uint8_t>(task.kind());
    header.dtype = static_cast<uint8_t>(task.dtype());
    header.reduce_op = static_cast<uint8_t>(task.op().reduce_op);
    header.part = partition.part;
    header.round = task.round();
    header.signature = partition.signature;
    header.join_epoch = partition.join_epoch;
    header.length = partition.push_length;
    status = peer.channel->SendData(header, partition.data,
                                    SlotKey{{task.tensor_id(), partition.part}, kStagedCopy});
  }
  if (tracer && status.ok()) {
    // REDUCE: until the leader has this worker's copy; BROADCAST: until its result.
    const int64_t sent_at = Timeline::Now();
    tracer->Stage(task.trace_session(), task.name(), task.round(), partition.part, "REDUCE",
                  partition.queued_at, sent_at);
    MarkSent(partition, sent_at);
  }
  task.EndIo();
  if (!status.ok())
    task.Fail(Status::Error(ErrorKind::kPeerGone, status.message() + " while sending partition " +
                                                      std::to_string(partition.part) +
                                                      " of tensor '" + task.name() + "' to " +
                                                      peer.name + ", which merges it"));
  return true;  // The other peers' partitions still go.
}

LocalMerge::Effects::Message& LocalMerge::Queue(Effects* effects, int peer, FrameType type,
                                                const PartitionKey& key, uint32_t round) const {
  Effects::Message& message = effects->messages.emplace_back();
  message.peer = peer;
  message.header.type = static_cast<uint8_t>(type);
  message.header.rank = static_cast<uint32_t>(options_.rank);
  message.header.tensor_id = key.tensor_id;
  message.header.part = key.part;
  message.header.round = round;
  return message;
}

void LocalMerge::QueueError(Effects* effects, int peer, const PartitionKey& key, uint32_t round,
                            ErrorKind kind, const std::string& text) const {
  Effects::Message& error = Queue(effects, peer, FrameType::kError, key, round);
  error.header.error_kind = static_cast<uint8_t>(kind);
  error.header.length = text.size();
  error.payload = text;
}

std::shared_ptr<Task> LocalMerge::Announced(uint64_t tensor_id, uint32_t round) {
  auto found = announced_.find(tensor_id);
  if (found == announced_.end()) return nullptr;
  std::shared_ptr<Task> task = found->second.lock();
  return task && task->round() == round ? task : nullptr;
}

void LocalMerge::Run(Effects& effects) {
  for (Effects::Message& message : effects.messages) {
    LocalPeers::Peer& peer = *peers_.peer(message.peer);
    // A broken channel is reported by its receiver.
    Status status = message.data
                        ? peer.channel->SendData(
                              message.header, message.data,
                              SlotKey{{message.header.tensor_id, message.header.part}, kMergedCopy})
                        : peer.channel->Send(message.header, message.payload.data());
    if (!status.ok()) BPS_LOG(kDebug) << status.message();
  }
  for (auto& delivery : effects.deliveries) {
    Task& task = *delivery.task;
    if (!task.BeginIo()) continue;
    std::memcpy(static_cast<char*>(task.output()) + delivery.offset, delivery.data,
                delivery.length);
    task.EndIo();
    Delivered(delivery.task, delivery.offset, delivery.length, false);
  }
  for (auto& [task, status] : effects.failures) task->Fail(status);
  for (auto& [task, item] : effects.upstream) {
    task->Launch(1);
    owner_->SendToServer(std::move(item));
  }
  for (auto& [tensor_id, round] : effects.abandoned)
    owner_->AbandonAtServers(tensor_id, round, OpKind::kPushPull);
}

// ---------------------------------------------------------------------------
// Peers' frames

Status LocalMerge::SendToPeer(int index, const FrameHeader& header, const std::string& payload) {
  LocalPeers::Peer* peer = peers_.peer(index);
  if (!peer) return Status::Error("no worker of local index " + std::to_string(index));
  return peer->channel->Send(header, payload.data());
}

Status LocalMerge::OnFrame(int index, const FrameHeader& header, DataReader* payload) {
  LocalPeers::Peer& peer = *peers_.peer(index);
  if (header.rank != static_cast<uint32_t>(peer.rank))
    return Status::Error(peer.name + " sent a frame as rank " + std::to_string(header.rank));
  Effects effects;
  switch (static_cast<FrameType>(header.type)) {
    case FrameType::kDeclare: {
      if (header.length > kMaxDeclarationBytes)
        return Status::Error(peer.name + " sent an oversized declaration");
      std::string frame(header.length, '\0');
      Status status = payload->Read(frame.data(), frame.size());
      Declaration declaration;
      if (status.ok() && !DecodeDeclaration(frame, &declaration))
        status = Status::Error(peer.name + " sent a malformed declaration");
      if (!status.ok()) return status;
      std::lock_guard<std::mutex> lock(merge_mutex_);
      declarations_.Put(header.tensor_id, RankOf(index), std::move(declaration), header.round);
      CheckAgreement(header.tensor_id, index, &effects);
      break;
    }
    case FrameType::kPush: {
      // Contributions lie in the peer's shared memory: summed from there, never copied.
      const char* data = payload->View(header.length);
      if (!data && header.length > 0)
        return Status::Error(peer.name + " sent a partition outside shared memory");
      if (!IsPushPull(static_cast<OpKind>(header.op_kind)) ||
          LeaderOf(header.tensor_id, header.part) != index_)
        return Status::Error(peer.name + " sent partition " + std::to_string(header.part) +
                             " of tensor id " + std::to_string(header.tensor_id) +
                             ", which this worker does not merge");
      std::lock_guard<std::mutex> lock(merge_mutex_);
      Arrive(index, header, data, nullptr, &effects);
      break;
    }
    case FrameType::kReply:
    case FrameType::kError:
      return HandleResult(index, header, payload);
    case FrameType::kMergeReady:
    case FrameType::kMergeGo:
      if (!merge_frames_) return Status::Error(peer.name + " sent a device-merge frame");
      return merge_frames_(index, header, payload);
    case FrameType::kAbandon: {
      std::lock_guard<std::mutex> lock(merge_mutex_);
      GiveUp(PartitionKey{header.tensor_id, header.part},
             Arrival{static_cast<uint32_t>(peer.rank), header.round, 0}, &effects);
      break;
    }
    case FrameType::kJoin: {
      std::lock_guard<std::mutex> lock(merge_mutex_);
      joined_epoch_[index] = header.join_epoch;
      RecheckAll(&effects);
      break;
    }
    default:
      return Status::Error("unexpected frame type " + std::to_string(header.type) + " from " +
                           peer.name);
  }
  Run(effects);
  return Status::OK();
}

Status LocalMerge::HandleResult(int index, const FrameHeader& header, DataReader* payload) {
  const std::string& from = peers_.peer(index)->name;
  Status error = Status::OK();
  if (header.type == static_cast<uint8_t>(FrameType::kError)) {
    Status status = ReadAnswerError(header, payload, from, &error);
    if (!status.ok()) return status;
  }
  PendingPartition pending;
  if (!pending_.Take(header, index, &pending)) {
    if (!error.ok()) {
      // An operation of this worker that does not merge, refused by a leader whose
      // round it left waiting.
      std::shared_ptr<Task> announced;
      {
        std::lock_guard<std::mutex> lock(merge_mutex_);
        announced = Announced(header.tensor_id, header.round);
      }
      if (announced) announced->Fail(error);
    }
    return payload->Skip();
  }
  Task& task = *pending.task;
  if (!error.ok()) {
    task.Fail(error);
    return Status::OK();
  }
  Timeline* const tracer = TracerFor(task);
  // The leader's result: averaged and scaled by its server link already.
  return ReadAnswer(header, payload, pending, from, false, [&](void*, size_t) {
    if (tracer && pending.sent_at)
      tracer->Stage(task.trace_session(), task.name(), task.round(), header.part, "BROADCAST",
                    pending.sent_at, Timeline::Now());
  });
}

void LocalMerge::OnPeerGone(int index, const std::string& failure) {
  Effects effects;
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    if (closing_ && !failure.empty()) return;  // This worker's Close() broke the channel.
    finished_[index] = true;
    const std::string why = peers_.peer(index)->name +
                            (failure.empty() ? " has shut down" : " vanished") +
                            " before returning ";
    for (const PendingPartition& pending :
         pending_.TakeIf([&](const PendingPartition& p) { return p.peer == index; }))
      effects.failures.emplace_back(
          pending.task,
          Status::Error(ErrorKind::kPeerGone, why + "partition " + std::to_string(pending.part) +
                                                  " of tensor '" + pending.task->name() + "'"));
    RecheckAll(&effects);
  }
  Run(effects);
  if (!failure.empty()) owner_->OnLinkFailure(failure);
}

// ---------------------------------------------------------------------------
// Failures, joins and the end

void LocalMerge::AbandonUnsent(const Task& task, uint32_t part) {
  const PartitionKey key{task.tensor_id(), part};
  const int leader = LeaderOf(key.tensor_id, part);
  Effects effects;
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    if (leader != index_) {
      Queue(&effects, leader, FrameType::kAbandon, key, task.round()).header.op_kind =
          static_cast<uint8_t>(OpKind::kPushPull);
    } else {
      declarations_.Put(key.tensor_id, own_rank(), task.op(), task.round());
      GiveUp(key, Arrival{own_rank(), task.round(), 0}, &effects);
    }
  }
  Run(effects);
}

void LocalMerge::Abandon(uint64_t tensor_id, uint32_t round) {
  Effects effects;
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    for (const PendingPartition& pending : pending_.TakeIf([&](const PendingPartition& p) {
           return p.task->tensor_id() == tensor_id && p.task->round() == round;
         }))
      Queue(&effects, pending.peer, FrameType::kAbandon, PartitionKey{tensor_id, pending.part},
            round)
          .header.op_kind = static_cast<uint8_t>(OpKind::kPushPull);
    for (auto& [key, state] : merges_) {
      if (key.tensor_id != tensor_id || !state.round.active() || state.round.round() != round ||
          !state.own)
        continue;
      GiveUp(key, Arrival{own_rank(), round, 0}, &effects);
    }
  }
  // A peer may still read what was staged for the failed round: the next goes elsewhere.
  slots_->Retire(tensor_id);
  Run(effects);
}

void LocalMerge::BeginJoin() {
  Effects effects;
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    joined_epoch_[index_] = epoch_;
    for (size_t i = 0; i < peers_.size(); ++i)
      if (peers_.peer(i))
        Queue(&effects, static_cast<int>(i), FrameType::kJoin, PartitionKey{}, 0)
            .header.join_epoch = epoch_;
    RecheckAll(&effects);
  }
  Run(effects);
}

void LocalMerge::EndJoin() {
  std::lock_guard<std::mutex> lock(merge_mutex_);
  ++epoch_;
}

void LocalMerge::FailExpired(std::chrono::steady_clock::time_point now) {
  Effects effects;
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    for (const PendingPartition& pending : pending_.Expired(now)) {
      effects.failures.emplace_back(
          pending.task,
          Status::Error(ErrorKind::kTimeout,
                        "push_pull of tensor '" + pending.task->name() + "' (round " +
                            std::to_string(pending.task->round()) + ") timed out after " +
                            std::to_string(pending.task->timeout_seconds()) + " s waiting for " +
                            peers_.peer(pending.peer)->name + ", which merges partition " +
                            std::to_string(pending.part) +
                            ", to return it (a worker may not have sent it; see "
                            "BYTEPS_OP_TIMEOUT)"));
    }
    for (const auto& [key, state] : merges_) {
      if (!state.round.active() || !state.own || !state.own->expired(now)) continue;
      std::string missing;
      for (size_t i = 0; i < state.inputs.size(); ++i)
        if (!state.inputs[i])
          missing += (missing.empty() ? "" : ", ") + std::to_string(options_.ranks[i]);
      effects.failures.emplace_back(
          state.own,
          Status::Error(ErrorKind::kTimeout,
                        "push_pull of tensor '" + state.own->name() + "' (round " +
                            std::to_string(state.round.round()) + ") timed out after " +
                            std::to_string(state.own->timeout_seconds()) + " s waiting for " +
                            (missing.empty() ? "the servers"
                                             : "worker rank(s) " + missing + " of this host") +
                            " (partition " + std::to_string(key.part) +
                            "; see BYTEPS_OP_TIMEOUT)"));
    }
  }
  Run(effects);
}

void LocalMerge::FailPending(const Status& reason) {
  Effects effects;
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    for (const PendingPartition& pending : pending_.TakeIf())
      effects.failures.emplace_back(pending.task,
                                    reason.WithSuffix(" (tensor '" + pending.task->name() + "')"));
    for (const auto& [key, state] : merges_)
      if (state.round.active() && state.own)
        effects.failures.emplace_back(state.own,
                                      reason.WithSuffix(" (tensor '" + state.own->name() + "')"));
  }
  Run(effects);
}

void LocalMerge::Close() {
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    if (closing_) return;
    closing_ = true;
  }
  push_stage_.Close();
  push_stage_.Join();
  peers_.Close();
}

}  // namespace bps
