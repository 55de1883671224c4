// A worker's connection to one server: the push and pull stages (server_link.h).
#include "server_link.h"

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

ServerLink::ServerLink(Owner* owner, int rank, int index, ServerAddress address,
                       std::unique_ptr<Channel> channel, size_t credit_bytes, uint32_t push_window)
    : owner_(owner),
      rank_(rank),
      index_(index),
      push_window_(push_window),
      address_(std::move(address)),
      channel_(std::move(channel)),
      credits_(credit_bytes) {}

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
  return task.trace_session() ? owner_->timeline() : nullptr;
}

bool ServerLink::Enqueue(PartitionTask& task) {
  if (retired_.load()) return false;
  if (TracerFor(*task.task)) task.queued_at = Timeline::Now();
  pending_.Add(PendingPartition::Of(task));
  if (retired_.load()) {
    // Retire() ran meanwhile: it handed this partition back with the others, or it
    // did not, and the caller sends it elsewhere. Exactly one of the two.
    const auto mine = [&](const PendingPartition& p) {
      return p.task == task.task && p.part == task.part;
    };
    return pending_.TakeIf(mine).empty();
  }
  push_stage_.Push(std::move(task));
  return true;
}

std::vector<PendingPartition> ServerLink::Retire() {
  retired_ = true;
  push_stage_.Close();
  // A server still alive (frozen a while, or cut off from this worker alone) hears
  // nothing more from here; the job went on without it.
  channel_->Shutdown();
  return pending_.TakeIf();
}

void ServerLink::SendProcessSet(uint32_t id, const std::vector<int32_t>& ranks) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kProcessSet);
  header.rank = static_cast<uint32_t>(rank_);
  header.process_set = id;
  header.length = ranks.size() * sizeof(int32_t);
  Status status = channel_->Send(header, ranks.data());
  if (!status.ok()) BPS_LOG(kDebug) << status.message();  // Reported by the link's threads.
}

void ServerLink::Abandon(uint64_t tensor_id, uint32_t round, OpKind kind) {
  channel_->RetireSlots(tensor_id);
  std::vector<uint32_t> parts;
  for (const PendingPartition& pending : pending_.TakeIf([&](const PendingPartition& p) {
         return p.task->tensor_id() == tensor_id && p.task->round() == round;
       })) {
    parts.push_back(pending.part);
    ReturnCredit(pending);
  }
  SendAbandons(tensor_id, round, kind, parts);
}

void ServerLink::AbandonUnsent(uint64_t tensor_id, uint32_t round, uint32_t part, OpKind kind) {
  SendAbandons(tensor_id, round, kind, {part});
}

void ServerLink::SendAbandons(uint64_t tensor_id, uint32_t round, OpKind kind,
                              const std::vector<uint32_t>& parts) {
  if (parts.empty() || owner_->stopping()) return;
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kAbandon);
  header.op_kind = static_cast<uint8_t>(kind);
  header.rank = static_cast<uint32_t>(rank_);
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
  const uint32_t window = push_window_;
  if (window && partition.part >= partition.task->answered() + window) return false;
  return credits_.TryTake(partition.priority, partition.push_length);
}

void ServerLink::ReturnCredit(const PendingPartition& pending) {
  if (!pending.credited) return;
  credits_.Return(pending.priority, pending.push_length);
  push_stage_.Recheck();
}

bool ServerLink::Push(PartitionTask& partition) {
  Task& task = *partition.task;
  // The credit Admit took stays with the pending partition until its answer.
  if (!pending_.Update(partition.task, partition.part,
                       [](PendingPartition& pending) { pending.credited = true; }))
    credits_.Return(partition.priority, partition.push_length);  // abandoned meanwhile
  if (!task.BeginIo()) return true;  // Failed meanwhile: nothing to send.
  Timeline* const tracer = TracerFor(task);
  const int64_t served_at = tracer ? Timeline::Now() : 0;
  FrameHeader header;
  header.rank = static_cast<uint32_t>(rank_);
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
  const char* data = partition.data;
  size_t length = partition.push_length;
  if (task.compression()) {
    CompressPartition(partition, &header);
    data = compressed_.data();
    length = compressed_.size();
  }
  // The answer may come back before this thread notes when the push ended: PULL then
  // counts from when the push began.
  if (tracer) MarkSent(partition, served_at);
  Status status = SendPartition(partition, data, length, &header);
  if (status.ok()) owner_->stats()->Pushed(length, partition.push_length);
  if (tracer && status.ok()) {
    const int64_t pushed_at = Timeline::Now();
    tracer->Stage(task.trace_session(), task.name(), task.round(), partition.part, "QUEUE",
                  partition.queued_at, served_at);
    tracer->Stage(task.trace_session(), task.name(), task.round(), partition.part, "PUSH",
                  served_at, pushed_at);
    MarkSent(partition, pushed_at);
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
  if (!retired_ && !held_)
    owner_->OnLinkFailure(status.message() + " while pushing tensor '" + task.name() + "' to " +
                          description());
  return false;
}

void ServerLink::MarkSent(const PartitionTask& partition, int64_t at) {
  pending_.Update(partition.task, partition.part,
                  [at](PendingPartition& pending) { pending.sent_at = at; });
}

void ServerLink::CompressPartition(const PartitionTask& partition, FrameHeader* header) {
  const Task& task = *partition.task;
  const CompressionSetup& setup = *task.compression();
  const size_t elements = partition.push_length / sizeof(float);
  const PartitionKey key{task.tensor_id(), partition.part};
  PushCompression& compression = push_compression_[key];
  if (!compression.state || compression.setup != &setup || compression.elements != elements) {
    compression.state =
        std::make_unique<CompressionState>(setup.spec, setup.compressor.get(), elements);
    compression.setup = &setup;
    compression.elements = elements;
  }
  compressed_.resize(setup.compressor->CompressedBytes(elements));
  // The residual is part of a gradient meant for the step it was left out of: when the
  // learning rate changed since, it is rescaled so that it moves the weights as much.
  double residual_scale = 1.0;
  if (task.learning_rate() > 0) {
    if (compression.learning_rate > 0)
      residual_scale = compression.learning_rate / task.learning_rate();
    compression.learning_rate = task.learning_rate();
  }
  // The stream is the partition's, as at the server: randomk then picks the same
  // elements on every worker and in the server's reply.
  compression.state->Compress(reinterpret_cast<const float*>(partition.data),
                              PartitionKeyHash()(key), task.round(), residual_scale,
                              compressed_.data());
  header->rows = static_cast<int64_t>(elements);
}

Status ServerLink::SendPartition(const PartitionTask& partition, const char* data, size_t length,
                                 FrameHeader* header) {
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
  header->length = length;
  // A broadcast root's data goes to the receivers from where it lies; alternating
  // copies keep its next round from overwriting what they may still be reading.
  const uint32_t copy = task.kind() == OpKind::kBroadcast ? task.round() % 2 : 0;
  return channel_->SendData(*header, data, SlotKey{{task.tensor_id(), partition.part}, copy});
}

bool ServerLink::TakePending(const FrameHeader& header, PendingPartition* pending) {
  if (!pending_.Take(header, 0, pending)) return false;
  ReturnCredit(*pending);
  pending->task->CountAnswer();
  owner_->OnAnswer();
  return true;
}

void ServerLink::FinishPartition(const Task& task, void* data, size_t bytes) {
  // A task on device memory finishes there, once its answer is copied (Delivered).
  if (!IsReduction(task.kind()) || task.staging()) return;
  const Declaration& op = task.op();
  const size_t count = bytes / DataTypeSize(op.dtype);
  if (op.reduce_op == ReduceOp::kAverage) DivideInPlace(op.dtype, data, count, task.group().size());
  ScaleInPlace(op.dtype, data, count, op.postscale);
}

Status ServerLink::HandleReply(const FrameHeader& header, DataReader* payload) {
  // Read an error's message first: the stream must stay in step whatever the task's fate.
  Status error = Status::OK();
  if (header.type == static_cast<uint8_t>(FrameType::kError)) {
    Status status = ReadAnswerError(header, payload, description(), &error);
    if (!status.ok()) return status;
  }
  PendingPartition pending;
  if (!TakePending(header, &pending)) return payload->Skip();
  Task& task = *pending.task;
  if (!error.ok()) {
    task.Fail(error);
    return Status::OK();
  }
  if (IsGather(task.kind()) && header.part == kSizesPart && header.length == pending.reply_length)
    return StartGather(header, payload, pending);
  Timeline* const tracer = TracerFor(task);
  return ReadAnswer(
      header, payload, pending, description(), true,
      [&](void* data, size_t bytes) {
        FinishPartition(task, data, bytes);
        if (tracer && pending.sent_at)
          tracer->Stage(task.trace_session(), task.name(), task.round(), header.part, "PULL",
                        pending.sent_at, Timeline::Now());
      },
      task.compression());
}

Status ServerLink::StartGather(const FrameHeader& header, DataReader* payload,
                               const PendingPartition& pending) {
  // The first step of a gather: now the output's size and this worker's place in it
  // are known, and the rows can move.
  Task& task = *pending.task;
  if (!task.BeginIo()) return payload->Skip();
  std::vector<char> sizes(header.length);
  Status status = payload->Read(sizes.data(), sizes.size());
  Status started = status.ok() ? owner_->StartGatherData(pending.task, sizes) : status;
  task.EndIo();
  if (!status.ok()) return status;  // The stream is broken.
  if (!started.ok()) {
    task.Fail(started);
  } else {
    task.PartitionDone();
  }
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
  owner_->OnJoined(index_, last, rounds);
  return Status::OK();
}

void ServerLink::SendJoin() {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kJoin);
  header.rank = static_cast<uint32_t>(rank_);
  Status status = channel_->Send(header, nullptr);
  if (!status.ok()) BPS_LOG(kDebug) << status.message();  // Reported by the link's threads.
}

// A stall warning's text (a tensor's name and a list of ranks) is bounded by this.
constexpr size_t kMaxStallText = 1 << 16;

void ServerLink::ReceiveLoop() {
  bool said_why = false;  // The server said Bye: it stops, it is not lost.
  while (true) {
    FrameHeader header;
    DataReader payload;
    bool eof = false;
    Status status = channel_->Receive(&header, &payload, &eof);
    if (status.ok()) {
      const auto type = static_cast<FrameType>(header.type);
      if (type == FrameType::kReply || type == FrameType::kError) {
        if (type == FrameType::kReply) owner_->stats()->Pulled(header.length);
        status = HandleReply(header, &payload);
      } else if (type == FrameType::kJoined) {
        status = HandleJoined(header, &payload);
      } else if (type == FrameType::kStall && header.length <= kMaxStallText) {
        std::string warning(header.length, '\0');
        status = payload.Read(warning.data(), warning.size());
        if (status.ok()) owner_->OnStall(header.tensor_id, description() + ": " + warning);
      } else if (type == FrameType::kBye && header.length <= (1u << 20)) {
        std::string why(header.length, '\0');
        status = payload.Read(why.data(), why.size());
        if (status.ok()) status = Status::Error(description() + " is stopping: " + why);
        said_why = true;
      } else {
        status = Status::Error("unexpected frame type " + std::to_string(header.type) + " from " +
                               description());
      }
    }
    if (!status.ok()) {
      if (!retired_ && !owner_->stopping()) {
        if (!said_why) held_ = owner_->OnServerLost(index_);
        if (!held_) owner_->OnLinkFailure(status.message());
      }
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
  for (const PendingPartition& pending : pending_.TakeIf()) {
    ReturnCredit(pending);
    pending.task->Fail(reason.WithSuffix(" (tensor '" + pending.task->name() + "')"));
  }
}

void ServerLink::FailExpired(std::chrono::steady_clock::time_point now) {
  for (const PendingPartition& pending : pending_.Expired(now)) {
    const Task& task = *pending.task;
    pending.task->Fail(Status::Error(
        ErrorKind::kTimeout, std::string(OpKindName(task.kind())) + " of tensor '" + task.name() +
                                 "' (round " + std::to_string(task.round()) + ") timed out after " +
                                 std::to_string(task.timeout_seconds()) + " s waiting for " +
                                 description() + " to return partition " +
                                 std::to_string(pending.part) +
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

}  // namespace bps
