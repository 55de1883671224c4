#include "round_engine.h"

#include <algorithm>

#include "../common/logging.h"
#include "../rounds/policy.h"

namespace bps {

// What a key's round reports to and asks of: the workers' answers, the tensor's name
// in messages, and memory for the round's result.
class RoundEngine::KeyPort : public RoundAnswers, public ResultMemory {
 public:
  KeyPort(RoundEngine* engine, const PartitionKey& id, KeyState* key)
      : engine_(engine), id_(id), key_(key) {}

  void Error(uint32_t rank, uint32_t round, ErrorKind kind, const std::string& message) override {
    engine_->SendError(rank, id_, round, kind, message);
  }
  std::string Tensor(uint32_t rank) override {
    return engine_->setup_.declarations->Describe(id_.tensor_id, rank);
  }
  std::string Mismatch(uint32_t a, uint32_t b) override {
    return engine_->setup_.declarations->Mismatch(id_.tensor_id, a, b);
  }
  void Release() override {
    if (key_->holds_result_slot) engine_->setup_.results->Release(key_->result_slot);
    key_->holds_result_slot = false;
    key_->data.Clear(engine_->setup_.pool);
  }

  char* Shared(size_t length) override {
    char* slot = nullptr;
    Status status = engine_->setup_.results->Slot(SlotKey{id_}, length, &slot, &key_->result_slot);
    if (!status.ok()) {
      engine_->host_->Fail(status.message());
      return nullptr;
    }
    key_->holds_result_slot = true;  // until the round closes, after the replies
    return slot;
  }
  char* Private(size_t length) override {
    key_->data.reply = engine_->setup_.pool->Acquire(length);
    return key_->data.reply.data.get();
  }

 private:
  RoundEngine* const engine_;
  const PartitionKey id_;
  KeyState* const key_;
};

RoundEngine::RoundEngine(Host* host, Setup setup) : host_(host), setup_(setup) {}

RoundEngine::~RoundEngine() {
  Stop();
  std::lock_guard<std::mutex> lock(mutex_);
  setup_.metrics->Queued(-static_cast<int64_t>(queue_.size()));
}

void RoundEngine::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RoundEngine::Enqueue(EngineItem item) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(item));
    setup_.metrics->Queued(1);
  }
  cv_.notify_one();
}

void RoundEngine::EnqueueFirst(EngineItem item) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_front(std::move(item));
    setup_.metrics->Queued(1);
  }
  cv_.notify_one();
}

void RoundEngine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RoundEngine::AddTraffic(std::map<uint64_t, std::pair<uint64_t, uint64_t>>* by_tensor) const {
  for (const auto& [id, key] : keys_) {
    (*by_tensor)[id.tensor_id].first += key.bytes_in;
    (*by_tensor)[id.tensor_id].second += key.bytes_out;
  }
}

void RoundEngine::Loop() {
  using Clock = std::chrono::steady_clock;
  // The inspector looks a few times per check time: a stall is reported within a
  // quarter of it late.
  const auto stall_every = std::chrono::milliseconds(
      std::clamp(setup_.stall_check_ms / 4, 100, 5000));
  next_stall_check_ = Clock::now() + stall_every;
  while (true) {
    if (setup_.stall_check_ms > 0 && Clock::now() >= next_stall_check_) {
      CheckStalls(Clock::now());
      next_stall_check_ = Clock::now() + stall_every;
    }
    EngineItem item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const auto ready = [&] { return stopping_ || !queue_.empty(); };
      if (setup_.stall_check_ms <= 0) {
        cv_.wait(lock, ready);
      } else if (!cv_.wait_until(lock, next_stall_check_, ready)) {
        continue;  // time to look for stalls
      }
      if (stopping_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      setup_.metrics->Queued(-1);
    }
    switch (item.kind_of_item) {
      case EngineItem::Kind::kFailRounds:
        FailRounds(host_->failure());
        break;
      case EngineItem::Kind::kAbandon:
        Process(std::move(item));
        break;
      case EngineItem::Kind::kJoined:
        for (auto& [id, key] : keys_)
          if (key.round.active()) MaybeFinish(id, &key);
        break;
      case EngineItem::Kind::kJoinReport:
        ReportRounds();
        break;
      case EngineItem::Kind::kForget:
        Forget(item.rank);
        break;
      case EngineItem::Kind::kPush: {
        const uint32_t rank = item.rank;
        Process(std::move(item));
        host_->PushDone(rank);
        break;
      }
    }
  }
}

void RoundEngine::Process(EngineItem item) {
  const PartitionKey id{item.tensor_id, item.part};
  if (host_->failing()) {
    // No key state for a job that is over: the push only hears why.
    SendError(item.rank, id, item.round, ErrorKind::kPeerGone,
              "the job is failing: " + host_->failure() + " (tensor " +
                  setup_.declarations->Describe(id.tensor_id, item.rank) + ")");
    setup_.pool->Release(std::move(item.block));
    return;
  }
  KeyState& key = keys_[id];
  KeyPort port(this, id, &key);
  const Arrival arrival{item.rank, item.round, 0};
  if (item.kind_of_item == EngineItem::Kind::kAbandon) {
    // Rounds of an asynchronous key wait for nobody but rank 0's first push.
    if (key.async.started() || item.spec.kind == OpKind::kAsyncPushPull) {
      key.async.GiveUp(item.rank, &port);
    } else {
      key.round.GiveUp(arrival, &port);
    }
  } else if (item.spec.kind == OpKind::kAsyncPushPull || key.async.started()) {
    ProcessAsync(&key, &item, &port);
  } else {
    const Round::Admission admission = key.round.Admit(arrival, &port);
    const bool taking_part = admission == Round::Admission::kJoins ||
                             (admission == Round::Admission::kOpens && Open(&key, item, &port));
    if (taking_part && Agrees(&key, item, &port)) {
      const std::vector<uint32_t> single{item.rank};
      const auto& counts_for = item.host_merged ? (*setup_.host_ranks)[item.rank] : single;
      if (key.round.Add(arrival, counts_for, item.part, &port)) {
        // The round's first push opened it just now: it is 0 late.
        setup_.ranks[item.rank]->PushArrived(std::chrono::steady_clock::now() - key.opened_at);
        key.bytes_in += item.wire_length;
        PolicyFor(key.data.spec.kind)
            .Add(&key.data, item.rank,
                 Contribution{std::move(item.block), item.shared, item.length, item.rows},
                 setup_.pool);
        const size_t pushed = key.round.contributors().size();
        const auto opened_at = key.opened_at;
        if (MaybeFinish(id, &key) && setup_.stragglers != nullptr && pushed > 1) {
          const auto now = std::chrono::steady_clock::now();
          setup_.stragglers->RoundEnded(item.rank, now - opened_at, now);
        }
      }
    }
  }
  setup_.pool->Release(std::move(item.block));  // Unless a round took it.
}

bool RoundEngine::Open(KeyState* key, const EngineItem& item, KeyPort* port) {
  std::vector<uint32_t> members;
  std::string refusal;
  if (!host_->MembersOf(item.spec.process_set, &members)) {
    refusal = "process set " + std::to_string(item.spec.process_set) + " is not registered here";
  } else if (!std::binary_search(members.begin(), members.end(), item.rank)) {
    refusal = "worker rank " + std::to_string(item.rank) + " is not a member of process set " +
              std::to_string(item.spec.process_set);
  }
  if (!refusal.empty()) {
    port->Error(item.rank, item.round, ErrorKind::kInvalidArgument,
                refusal + " (tensor " + port->Tensor(item.rank) + ")");
    return false;
  }
  key->round.Open(Arrival{item.rank, item.round, 0}, std::move(members));
  key->opened_at = std::chrono::steady_clock::now();
  key->data.spec = item.spec;
  PolicyFor(item.spec.kind).Open(&key->data, setup_.num_workers);
  return true;
}

bool RoundEngine::Agrees(KeyState* key, const EngineItem& item, KeyPort* port) {
  const Arrival arrival{item.rank, item.round, 0};
  // A host's merged push counts for each of its workers (the leader summed them).
  if (item.host_merged && (!IsPushPull(item.spec.kind) || item.spec.process_set != 0)) {
    key->round.Fail(ErrorKind::kInternal,
                    "worker rank " + std::to_string(item.rank) + " sent a host-merged " +
                        OpKindName(item.spec.kind) + " of tensor " + port->Tensor(item.rank) +
                        " (only push_pull in the global set merges)",
                    port, &arrival);
    return false;
  }
  const RoundSpec& spec = key->data.spec;
  const bool same_length = !IsReduction(item.spec.kind) || item.spec.length == spec.length;
  if (item.spec.signature == spec.signature && item.spec.kind == spec.kind &&
      item.spec.dtype == spec.dtype && item.spec.owner == spec.owner &&
      item.spec.process_set == spec.process_set && item.spec.compression == spec.compression &&
      same_length && key->round.IsMember(item.rank))
    return true;
  const uint32_t first =
      key->round.contributors().empty() ? item.rank : key->round.contributors().front();
  key->round.Fail(ErrorKind::kMismatch, port->Mismatch(first, item.rank), port, &arrival);
  return false;
}

void RoundEngine::ProcessAsync(KeyState* key, EngineItem* item, KeyPort* port) {
  const uint32_t rank = item->rank;
  const std::string worker = "worker rank " + std::to_string(rank);
  const std::string tensor = "tensor " + port->Tensor(rank);
  auto refuse = [&](ErrorKind kind, const std::string& why) {
    SendError(rank, PartitionKey{item->tensor_id, item->part}, item->round, kind, why);
  };
  if (item->spec.kind != OpKind::kAsyncPushPull)
    return refuse(ErrorKind::kMismatch, worker + " sent a " + OpKindName(item->spec.kind) + " of " +
                                            tensor +
                                            ", which other workers train asynchronously "
                                            "(BYTEPS_ENABLE_ASYNC=1)");
  if (!setup_.enable_async)
    return refuse(ErrorKind::kInvalidArgument,
                  worker + " trains " + tensor +
                      " asynchronously, but this server runs without BYTEPS_ENABLE_ASYNC=1: "
                      "set it on every worker and server");
  if (item->host_merged || item->spec.process_set != 0)
    return refuse(ErrorKind::kInternal,
                  worker + " sent a merged or process-set asynchronous push of " + tensor);
  if (!key->async.started()) {
    if (key->round.active() || key->round.last_closed() > 0)
      return refuse(ErrorKind::kMismatch, worker + " trains " + tensor +
                                              " asynchronously (BYTEPS_ENABLE_ASYNC=1), "
                                              "but other workers synchronise it");
    key->async.Start(rank, item->spec, setup_.num_workers);
  }
  std::vector<Arrival> replies;
  if (key->async.Push(Arrival{rank, item->round, 0}, item->spec, item->data(), setup_.pool, port,
                      &replies))
    key->bytes_in += item->wire_length;
  const PartitionKey id{item->tensor_id, item->part};
  for (const Arrival& reply : replies) {
    SendReply(reply.rank, id, reply.round, key->async.parameters(), key->async.length());
    key->bytes_out += key->async.length();
  }
}

bool RoundEngine::MaybeFinish(const PartitionKey& id, KeyState* key) {
  KeyPort port(this, id, key);
  if (key->round.Check(host_->roster(), &port) != Round::Progress::kComplete) return false;
  const RoundPolicy& policy = PolicyFor(key->data.spec.kind);
  const std::string unfinishable =
      policy.Unfinishable(key->data, port.Tensor(key->round.contributors().front()));
  if (!unfinishable.empty()) {
    key->round.Fail(ErrorKind::kInvalidArgument, unfinishable, &port);
    return false;
  }
  // A shared slot only pays when a same-host worker reads the result.
  ResultContext context{id.part, &key->round.members(), false, key->round.round()};
  for (uint32_t r : key->round.contributors())
    if (policy.Receives(key->data, r) && host_->SharesMemory(r)) context.local_reader = true;
  if (key->data.spec.compression) {
    context.result_compression = ResultCompression(id, key);
    context.stream = PartitionKeyHash()(id);
  }
  size_t length = 0;
  const char* result = policy.Result(&key->data, context, &port, &length);
  if (!result) {
    key->round.Fail(ErrorKind::kInternal,
                    "the server ran out of shared memory: " + host_->failure(), &port);
    return false;
  }
  key->bytes_out += length * Reply(id, *key, result, length);
  key->round.Succeed(&port);
  setup_.metrics->RoundFinished();
  return true;
}

CompressionState* RoundEngine::ResultCompression(const PartitionKey& id, KeyState* key) {
  const CompressionSetup* setup = key->data.spec.compression;
  const size_t elements = key->data.spec.length / sizeof(float);
  if (!key->result_compression || key->result_setup != setup || key->result_elements != elements) {
    // Momentum is the workers' (on the gradients they push); the sum is only compressed,
    // with error feedback when the spec asks for it.
    CompressorSpec spec = setup->spec;
    spec.nesterov = false;
    key->result_compression =
        std::make_unique<CompressionState>(spec, setup->compressor.get(), elements);
    key->result_setup = setup;
    key->result_elements = elements;
    BPS_LOG(kDebug) << "tensor " << setup_.declarations->Describe(id.tensor_id, 0) << " part "
                    << id.part << ": results compressed with '" << setup->text << "'";
  }
  return key->result_compression.get();
}

size_t RoundEngine::Reply(const PartitionKey& id, const KeyState& key, const char* result,
                          size_t length) {
  const RoundPolicy& policy = PolicyFor(key.data.spec.kind);
  // The others get an empty acknowledgement, sent last: a broadcast root may
  // overwrite its pushed data once it is answered.
  // Sends block, one worker after another: starting each partition's replies at a
  // different worker keeps every server from serving the same worker first, which
  // would leave that worker's link the bottleneck and the others idle.
  const std::vector<uint32_t>& contributors = key.round.contributors();
  const size_t count = contributors.size();
  const size_t first = count ? (id.part + key.round.round()) % count : 0;
  size_t receivers = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t r = contributors[(first + i) % count];
    if (!policy.Receives(key.data, r)) continue;
    SendReply(r, id, key.round.round(), result, length);
    ++receivers;
  }
  for (uint32_t r : contributors)
    if (!policy.Receives(key.data, r)) SendReply(r, id, key.round.round(), nullptr, 0);
  return receivers;
}

void RoundEngine::SendReply(uint32_t rank, const PartitionKey& id, uint32_t round, const void* data,
                            size_t length) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kReply);
  header.tensor_id = id.tensor_id;
  header.part = id.part;
  header.round = round;
  header.length = length;
  host_->SendResult(rank, header, data);
}

void RoundEngine::SendError(uint32_t rank, const PartitionKey& id, uint32_t round, ErrorKind kind,
                            const std::string& message) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kError);
  header.error_kind = static_cast<uint8_t>(kind);
  header.tensor_id = id.tensor_id;
  header.part = id.part;
  header.round = round;
  header.length = message.size();
  host_->Send(rank, header, message.data());
}

void RoundEngine::FailRounds(const std::string& reason) {
  for (auto& [id, key] : keys_) {
    KeyPort port(this, id, &key);
    key.async.FailWaiting(reason, &port);
    if (!key.round.active()) continue;
    key.round.Fail(ErrorKind::kPeerGone,
                   "the job is failing: " + reason + " (tensor " +
                       port.Tensor(key.round.contributors().front()) + ")",
                   &port);
  }
}

namespace {

// Milliseconds as the seconds a variable gave them: "60", "1.5".
std::string SecondsText(int ms) {
  std::string text = std::to_string(ms / 1000);
  if (ms % 1000 == 0) return text;
  std::string fraction = std::to_string(1000 + ms % 1000).substr(1);
  fraction.erase(fraction.find_last_not_of('0') + 1);
  return text + "." + fraction;
}

}  // namespace

void RoundEngine::CheckStalls(std::chrono::steady_clock::time_point now) {
  // One report per tensor and round, however many of its partitions this engine has.
  std::map<uint64_t, std::string> reports;
  for (auto& [id, key] : keys_) {
    Round& round = key.round;
    if (!round.active() || key.async.started()) continue;
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - key.opened_at).count();
    if (waited < setup_.stall_check_ms) continue;
    std::vector<uint32_t> missing;
    for (uint32_t rank : round.members())
      if (!round.Covers(rank) && !host_->roster().Joined(rank, round.epoch()))
        missing.push_back(rank);
    if (missing.empty()) continue;
    KeyPort port(this, id, &key);
    std::string ranks;
    for (uint32_t rank : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
    const std::string text =
        "tensor " + port.Tensor(round.contributors().front()) + " (round " +
        std::to_string(round.round()) + ") waits for worker rank(s) " + ranks + ", " +
        std::to_string(waited / 1000) + " s after the first worker pushed it; the workers may " +
        "be running different tensors, or some of them none";
    if (setup_.stall_shutdown_ms > 0 && waited >= setup_.stall_shutdown_ms) {
      round.Fail(ErrorKind::kTimeout,
                 text + " (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=" +
                     SecondsText(setup_.stall_shutdown_ms) + ")",
                 &port);
      continue;
    }
    if (key.stall_reported == round.round()) continue;
    key.stall_reported = round.round();
    reports.emplace(id.tensor_id, text + " (HOROVOD_STALL_CHECK_TIME_SECONDS=" +
                                      SecondsText(setup_.stall_check_ms) + ")");
  }
  for (const auto& [tensor_id, text] : reports) {
    BPS_LOG(kWarning) << "stalled: " << text;
    FrameHeader header;
    header.type = static_cast<uint8_t>(FrameType::kStall);
    header.tensor_id = tensor_id;
    header.length = text.size();
    for (int rank = 0; rank < setup_.num_workers; ++rank)
      host_->Send(static_cast<uint32_t>(rank), header, text.data());
  }
}

void RoundEngine::Forget(uint32_t rank) {
  // A round it pushed to and that is still open may read its memory: it ends here.
  // (A worker that shuts down cleanly has none: its pushes were all answered.)
  for (auto& [id, key] : keys_) {
    KeyPort port(this, id, &key);
    key.round.Forget(rank, &port);
  }
  host_->Forgotten(rank);
}

void RoundEngine::ReportRounds() {
  std::vector<std::pair<uint64_t, uint32_t>> rounds;
  for (const auto& [id, key] : keys_)
    rounds.emplace_back(id.tensor_id, std::max(key.round.last_closed(),
                                               key.round.active() ? key.round.round() : 0));
  host_->ReportRounds(rounds);
}

}  // namespace bps
