// The leader's side of the local merge (local_merge.h): the rounds of the partitions
// this worker merges for its host, kept by rounds/Round, and the host's sum that goes
// up to the servers. Every step here runs under merge_mutex_ and leaves what it
// decided in Effects, run once the lock is released.
#include <cstring>

#include "../common/reduce.h"
#include "local_merge.h"

namespace bps {

// What a merged partition's round reports to: its contributors' answers (frames to
// the peers, or this worker's own task), the tensor's name in messages, and the
// merge's data, let go of when the round ends.
class LocalMerge::MergePort : public RoundAnswers {
 public:
  MergePort(LocalMerge* merge, const PartitionKey& key, MergeState* state, Effects* effects,
            const PartitionTask* arriving = nullptr)
      : merge_(merge), key_(key), state_(state), effects_(effects), arriving_(arriving) {}

  void Error(uint32_t rank, uint32_t round, ErrorKind kind, const std::string& message) override {
    if (rank != merge_->own_rank()) {
      merge_->QueueError(effects_, merge_->IndexOf(rank), key_, round, kind, message);
      return;
    }
    // This worker's own contribution: the one in the round, or the one arriving.
    std::shared_ptr<Task> task;
    if (arriving_ && arriving_->task->round() == round) task = arriving_->task;
    if (!task && state_->own && state_->own->round() == round) task = state_->own;
    if (task) effects_->failures.emplace_back(task, Status::Error(kind, message));
  }
  std::string Tensor(uint32_t rank) override {
    return merge_->declarations_.Describe(key_.tensor_id, rank);
  }
  std::string Mismatch(uint32_t a, uint32_t b) override {
    return merge_->declarations_.Mismatch(key_.tensor_id, a, b);
  }
  void Release() override {
    // A merged push already at the servers: its round ends there too, for every host.
    if (state_->upstream) effects_->abandoned.emplace_back(key_.tensor_id, state_->round.round());
    state_->inputs.clear();
    state_->own.reset();
    state_->upstream.reset();
  }

 private:
  LocalMerge* const merge_;
  const PartitionKey key_;
  MergeState* const state_;
  Effects* const effects_;
  const PartitionTask* const arriving_;
};

void LocalMerge::GiveUp(const PartitionKey& key, const Arrival& arrival, Effects* effects) {
  MergeState& state = merges_[key];
  MergePort port(this, key, &state, effects);
  state.round.GiveUp(arrival, &port);
}

bool LocalMerge::Joined(uint32_t rank, uint16_t epoch) const {
  return joined_epoch_[IndexOf(rank)] == epoch;
}

bool LocalMerge::Gone(uint32_t rank) const { return finished_[IndexOf(rank)]; }

void LocalMerge::CheckAgreement(uint64_t tensor_id, int index, Effects* effects) {
  for (auto& [key, state] : merges_)
    if (key.tensor_id == tensor_id) CheckAgreement(key, &state, index, effects);
}

void LocalMerge::CheckAgreement(const PartitionKey& key, MergeState* state, int index,
                                Effects* effects) {
  if (!state->round.active() || state->inputs[index]) return;
  const uint32_t rank = RankOf(index);
  Declaration theirs;
  uint32_t their_round = 0;
  if (!declarations_.Find(key.tensor_id, rank, &theirs, &their_round)) return;
  const uint32_t round = state->round.round();
  if (round != their_round || (MergesOp(theirs) && Signature(theirs) == state->signature)) return;
  const std::string message =
      declarations_.Mismatch(key.tensor_id, state->round.contributors().front(), rank);
  MergePort port(this, key, state, effects);
  state->round.Fail(ErrorKind::kMismatch, message, &port);
  if (index == index_) {
    std::shared_ptr<Task> task = Announced(key.tensor_id, round);
    if (task) effects->failures.emplace_back(task, Status::Error(ErrorKind::kMismatch, message));
  } else {
    // Its operation waits at the servers; the error ends it (HandleResult).
    QueueError(effects, index, key, round, ErrorKind::kMismatch, message);
  }
}

void LocalMerge::Arrive(int index, const FrameHeader& push, const char* data,
                        const PartitionTask* own, Effects* effects) {
  const PartitionKey key{push.tensor_id, push.part};
  const uint32_t rank = RankOf(index);
  MergeState& state = merges_[key];
  if (own) declarations_.Put(key.tensor_id, rank, own->task->op(), push.round);
  MergePort port(this, key, &state, effects, own);
  const Arrival arrival{rank, push.round, push.join_epoch};
  switch (state.round.Admit(arrival, &port)) {
    case Round::Admission::kRefused:
      return;
    case Round::Admission::kOpens: {
      Declaration op;
      if (own) {
        op = own->task->op();
      } else if (!declarations_.Find(key.tensor_id, rank, &op)) {
        port.Error(rank, push.round, ErrorKind::kInternal,
                   "worker rank " + std::to_string(rank) + " pushed tensor id " +
                       std::to_string(key.tensor_id) + " without declaring it");
        return;
      }
      state.round.Open(arrival, members_);
      state.signature = push.signature;
      state.length = push.length;
      state.inputs.assign(members_.size(), nullptr);
      state.op = std::move(op);
      break;
    }
    case Round::Admission::kJoins:
      break;
  }
  if (push.signature != state.signature || push.length != state.length) {
    state.round.Fail(
        ErrorKind::kMismatch,
        declarations_.Mismatch(key.tensor_id, state.round.contributors().front(), rank), &port,
        &arrival);
    return;
  }
  if (!state.round.Add(arrival, {rank}, key.part, &port)) return;
  state.inputs[index] = data;
  if (own) {
    state.own = own->task;
    state.own_offset = own->offset;
    state.priority = own->priority;
    state.own_arrived_at = own->queued_at;
  }
  // A worker of the host that declared something else for this round never comes.
  for (size_t i = 0; i < state.inputs.size() && state.round.active(); ++i)
    CheckAgreement(key, &state, static_cast<int>(i), effects);
  MaybeMerge(key, &state, effects);
}

void LocalMerge::MaybeMerge(const PartitionKey& key, MergeState* state, Effects* effects) {
  if (!state->round.active() || state->upstream) return;
  MergePort port(this, key, state, effects);
  if (state->round.Check(*this, &port) != Round::Progress::kComplete) return;
  const uint32_t round = state->round.round();
  std::vector<const char*> inputs;  // Joined workers take part with nothing.
  for (const char* input : state->inputs)
    if (input) inputs.push_back(input);
  ShmLocation location;
  char* sum = nullptr;
  Status status = slots_->Slot(SlotKey{key, kMergedCopy}, state->length, &sum, &location);
  if (!status.ok()) {
    state->round.Fail(ErrorKind::kInternal, status.message(), &port);
    return;
  }
  const Declaration& op = state->op;
  ReduceAll(op.reduce_op, op.dtype, sum, inputs, state->length / DataTypeSize(op.dtype));
  state->sum = sum;
  if (state->own_arrived_at && state->own) {
    // The leader's REDUCE: from its own copy until the host's sum is ready.
    if (Timeline* tracer = TracerFor(*state->own))
      tracer->Stage(state->own->trace_session(), op.name, round, key.part, "REDUCE",
                    state->own_arrived_at, Timeline::Now());
  }
  owner_->Sample(op.name, key.tensor_id, round, op.dtype,
                 ("host sum of partition " + std::to_string(key.part)).c_str(), sum, state->length);
  // The host's sum goes up as a task of its own: the server links time it, abandon it
  // and finish it (average, postscale) like any other partition.
  TaskSpec spec;
  spec.op = op;
  spec.input = sum;
  spec.output = sum;
  spec.bytes = state->length;
  // The sum's slot is held while the merged task lives: its push reads it, its reply
  // lands in it, and its completion hands it to the peers (who then hold it).
  auto hold = std::make_shared<SlotHold>(slots_, location);
  state->upstream = std::make_shared<Task>(
      std::move(spec), owner_->GlobalGroup(), key.tensor_id, state->priority >> 32, round,
      options_.timeout_ms, nullptr,
      [this, key, round, hold](const Status& result) { OnUpstreamDone(key, round, result); });
  // Its pushes and pulls are this worker's part in the round: recorded where its own are.
  if (state->own) {
    state->upstream->set_trace_session(state->own->trace_session());
    state->upstream->set_learning_rate(state->own->learning_rate());
  }
  PartitionTask item =
      MakePartition(state->upstream, key.part, 0, sum, state->length, state->length);
  item.flags = kFlagHostMerged;
  item.priority = state->priority;
  effects->upstream.emplace_back(state->upstream, std::move(item));
}

void LocalMerge::OnUpstreamDone(const PartitionKey& key, uint32_t round, const Status& result) {
  Effects effects;
  {
    std::lock_guard<std::mutex> lock(merge_mutex_);
    auto found = merges_.find(key);
    if (found == merges_.end()) return;
    MergeState& state = found->second;
    if (!state.round.active() || state.round.round() != round || !state.upstream) return;
    state.upstream.reset();  // Over at the servers either way.
    MergePort port(this, key, &state, &effects);
    if (!result.ok()) {
      state.round.Fail(result.kind(), result.message(), &port);
    } else {
      for (size_t i = 0; i < state.inputs.size(); ++i) {
        if (!state.inputs[i] || static_cast<int>(i) == index_) continue;
        Effects::Message& reply =
            Queue(&effects, static_cast<int>(i), FrameType::kReply, key, round);
        reply.header.length = state.length;
        reply.data = state.sum;
      }
      if (state.own)
        effects.deliveries.push_back({state.own, state.own_offset, state.sum, state.length});
      state.round.Succeed(&port);
    }
  }
  Run(effects);
}

void LocalMerge::RecheckAll(Effects* effects) {
  for (auto& [key, state] : merges_) MaybeMerge(key, &state, effects);
}

}  // namespace bps
