#include "server.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "../common/logging.h"
#include "../wire/auth.h"

namespace bps {
namespace {

// Items a reader may hand to the engines before it stops reading from its worker;
// bounds server memory to the sum buffers plus this many blocks per worker.
constexpr int kMaxOutstandingPerWorker = 16;
constexpr uint64_t kMaxDeclarationBytes = 1 << 20;

}  // namespace

ServerOptions ServerOptions::From(const Settings& settings) {
  ServerOptions options;
  options.engine_threads = static_cast<int>(settings.Int("BYTEPS_SERVER_ENGINE_THREAD"));
  options.timeout_ms = static_cast<int>(settings.OperationTimeout() * 1000);
  options.token = settings.Text("BYTEPS_JOB_TOKEN");
  options.encrypt = settings.Flag("BYTEPS_ENCRYPT");
  options.max_tensor_bytes = static_cast<uint64_t>(settings.Int("BYTEPS_MAX_TENSOR_BYTES"));
  options.enable_async = settings.Flag("BYTEPS_ENABLE_ASYNC");
  if (!settings.Flag("HOROVOD_STALL_CHECK_DISABLE")) {
    options.stall_check_ms =
        static_cast<int>(settings.Number("HOROVOD_STALL_CHECK_TIME_SECONDS") * 1000);
    options.stall_shutdown_ms =
        static_cast<int>(settings.Number("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS") * 1000);
  }
  options.straggler_window_s = settings.Number("BYTEPS_STRAGGLER_WINDOW_SECONDS");
  options.straggler_threshold_ms = settings.Number("BYTEPS_STRAGGLER_THRESHOLD_MS");
  return options;
}

Server::Server(ServerOptions options)
    : options_(options),
      own_metrics_(options.metrics ? nullptr : std::make_unique<ServerMetrics>()),
      metrics_(options.metrics ? options.metrics : own_metrics_.get()) {}

Server::~Server() { Stop(); }

Status Server::Listen(int* bound_port) {
  if (::pipe2(failure_pipe_, O_CLOEXEC) != 0)
    return Status::Error(std::string("pipe() failed: ") + std::strerror(errno));
  return listener_.Listen(options_.host, options_.port, options_.timeout_ms, options_.token,
                          bound_port);
}

Status Server::Serve(const std::vector<int32_t>& host_of_rank, uint32_t generation,
                     std::vector<std::string> named_sources) {
  if (host_of_rank.empty() || !engines_.empty())
    return Status::Error("the server is already serving");
  listener_.set_generation(generation);
  num_workers_ = static_cast<int>(host_of_rank.size());
  WaitingRoom::Options room;
  room.secret = JobSecret(options_.token, options_.encrypt);
  room.num_workers = num_workers_;
  room.deadline_ms = options_.hello_deadline_ms;
  room.named_sources = std::move(named_sources);
  room_ = std::make_unique<WaitingRoom>(std::move(room));
  host_ranks_.assign(num_workers_, {});
  for (int r = 0; r < num_workers_; ++r)
    for (int q = 0; q < num_workers_; ++q)
      if (host_of_rank[q] == host_of_rank[r]) host_ranks_[r].push_back(static_cast<uint32_t>(q));
  finished_.assign(num_workers_, false);
  joined_.assign(num_workers_, false);
  conns_.resize(num_workers_);
  for (int r = 0; r < num_workers_; ++r) all_ranks_.push_back(static_cast<uint32_t>(r));
  RoundEngine::Setup setup;
  setup.num_workers = num_workers_;
  setup.host_ranks = &host_ranks_;
  setup.enable_async = options_.enable_async;
  setup.pool = &pool_;
  setup.declarations = &declarations_;
  setup.results = &listener_.shared_results();
  setup.stall_check_ms = options_.stall_check_ms;
  setup.stall_shutdown_ms = options_.stall_shutdown_ms;
  rank_metrics_ = metrics_->Ranks(num_workers_);
  setup.metrics = metrics_;
  setup.ranks = rank_metrics_;
  if (options_.straggler_window_s > 0 && num_workers_ > 1) {
    stragglers_ = std::make_unique<StragglerWatch>(
        options_.straggler_window_s, options_.straggler_threshold_ms,
        [this](uint32_t rank) {
          std::shared_ptr<WorkerConn> worker = ConnOf(rank);
          return "worker rank " + std::to_string(rank) +
                 (worker ? " (" + worker->channel->peer() + ")" : std::string());
        },
        [this](const std::vector<uint32_t>& named) {
          // The straggler gauge shows the last window's verdict: only atomics, no lock.
          for (size_t r = 0; r < rank_metrics_.size(); ++r)
            rank_metrics_[r]->straggler.store(std::count(named.begin(), named.end(), r) > 0);
        });
    setup.stragglers = stragglers_.get();
  }
  for (int i = 0; i < std::max(1, options_.engine_threads); ++i) {
    engines_.push_back(std::make_unique<RoundEngine>(static_cast<RoundEngine::Host*>(this), setup));
    engines_.back()->Start();
  }
  acceptor_ = std::thread([this] { AcceptLoop(); });
  BPS_LOG(kInfo) << "server serving " << num_workers_ << " worker(s) with " << engines_.size()
                 << " engine thread(s)";
  return Status::OK();
}

void Server::ReadLoop(std::shared_ptr<WorkerConn> worker) {
  Channel& conn = *worker->channel;
  const auto rank = static_cast<uint32_t>(worker->rank);
  Status status = Status::OK();
  bool closed = false;  // by the worker's side, or broken; else this server dropped it
  while (true) {
    FrameHeader header;
    DataReader payload;
    status = conn.Receive(&header, &payload, &closed);
    if (status.ok()) metrics_->Received(header.length);
    if (status.ok() && header.type == static_cast<uint8_t>(FrameType::kBye)) {
      {
        std::lock_guard<std::mutex> lock(conns_mutex_);
        finished_[rank] = true;
        ++finished_count_;
      }
      BPS_LOG(kDebug) << "worker rank " << rank << " finished";
      // Its memory goes once every engine has passed what it pushed before.
      worker->forgetting = static_cast<int>(engines_.size());
      EnqueueEverywhere(EngineItem::Kind::kForget, rank);
      return;
    }
    if (status.ok()) status = HandleFrame(worker.get(), rank, header, &payload);
    if (!status.ok()) break;
  }
  if (!stopping_) {
    SetFailure("worker rank " + std::to_string(rank) + " (" + conn.peer() + ") " +
                   (closed ? "disconnected without shutting down" : "was dropped") + ": " +
                   status.message(),
               static_cast<int>(rank));
  }
}

Status Server::HandleFrame(WorkerConn* worker, uint32_t rank, const FrameHeader& header,
                           DataReader* payload) {
  const auto type = static_cast<FrameType>(header.type);
  if (type == FrameType::kDeclare) return ReceiveDeclaration(rank, header, payload);
  if (type == FrameType::kJoin && header.length == 0) {
    OnJoin(rank);
    return Status::OK();
  }
  if (type == FrameType::kProcessSet) return ReceiveProcessSet(header, payload);
  const bool push = type == FrameType::kPush;
  if ((!push && type != FrameType::kAbandon) || !IsValidOpKind(header.op_kind) ||
      (push && (!IsValidDataType(header.dtype) || !IsValidReduceOp(header.reduce_op))) ||
      header.owner < -1 || header.owner >= num_workers_ ||
      (type == FrameType::kAbandon && header.length != 0)) {
    return Status::Error("unexpected frame (type " + std::to_string(header.type) +
                         ") from worker rank " + std::to_string(rank));
  }
  EngineItem item;
  if (type == FrameType::kAbandon) {
    item.kind_of_item = EngineItem::Kind::kAbandon;
    item.spec.kind = static_cast<OpKind>(header.op_kind);
    item.tensor_id = header.tensor_id;
    item.part = header.part;
    item.round = header.round;
    item.rank = rank;
    EngineOf(item.tensor_id, item.part).Enqueue(std::move(item));
    return Status::OK();
  }
  const CompressionSetup* compression = nullptr;
  Status status = CheckPushLength(header, rank, &compression);
  if (!status.ok()) return status;
  {
    std::unique_lock<std::mutex> lock(worker->mutex);
    worker->cv.wait(lock, [&] { return worker->outstanding < kMaxOutstandingPerWorker; });
    ++worker->outstanding;
  }
  status = ReceivePush(header, payload, compression, &item);
  if (!status.ok())
    return status.WithSuffix(" (worker rank " + std::to_string(rank) + ", tensor " +
                             declarations_.Describe(header.tensor_id, rank) + ")");
  item.rank = rank;  // The connection's rank, whatever the frame claims.
  EngineOf(item.tensor_id, item.part).Enqueue(std::move(item));
  return Status::OK();
}

Status Server::ReceiveDeclaration(uint32_t rank, const FrameHeader& header, DataReader* payload) {
  if (header.length > kMaxDeclarationBytes) return Status::Error("an oversized tensor declaration");
  std::string text(header.length, '\0');
  Status status = payload->Read(text.data(), text.size());
  if (!status.ok()) return status;
  Declaration declaration;
  if (!DecodeDeclaration(text, &declaration))
    return Status::Error("malformed tensor declaration from worker rank " + std::to_string(rank));
  if (DeclaredBytes(declaration) > options_.max_tensor_bytes) {
    return Status::Error(
        "worker rank " + std::to_string(rank) + " declared tensor '" + declaration.name + "' of " +
        bps::Describe(declaration) +
        ", more than BYTEPS_MAX_TENSOR_BYTES=" + std::to_string(options_.max_tensor_bytes));
  }
  declarations_.Put(header.tensor_id, rank, std::move(declaration));
  return Status::OK();
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

RoundEngine& Server::EngineOf(uint64_t tensor_id, uint32_t part) {
  return *engines_[PartitionKeyHash()(PartitionKey{tensor_id, part}) % engines_.size()];
}

Status Server::ReceivePush(const FrameHeader& header, DataReader* payload,
                           const CompressionSetup* compression, EngineItem* item) {
  item->tensor_id = header.tensor_id;
  item->part = header.part;
  item->round = header.round;
  item->spec.kind = static_cast<OpKind>(header.op_kind);
  item->spec.dtype = header.dtype;
  item->spec.reduce_op = static_cast<ReduceOp>(header.reduce_op);
  item->spec.signature = header.signature;
  item->spec.owner = header.owner;
  item->spec.process_set = header.process_set;
  item->spec.length = header.length;
  item->rows = header.rows;
  item->host_merged = (header.flags & kFlagHostMerged) != 0;
  item->length = header.length;
  item->wire_length = header.length;
  if (compression) return DecompressPush(header, payload, compression, item);
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

Status Server::DecompressPush(const FrameHeader& header, DataReader* payload,
                              const CompressionSetup* compression, EngineItem* item) {
  // The compressed bytes are read out of the sender's memory (shared memory too)
  // before they are checked: what is checked is what gets decompressed.
  thread_local std::vector<char> wire;
  wire.resize(header.length);
  Status status = payload->Read(wire.data(), wire.size());
  if (!status.ok()) return status;
  const auto elements = static_cast<size_t>(header.rows);
  const Compressor& compressor = *compression->compressor;
  if (!compressor.Valid(wire.data(), elements))
    return Status::Error("a malformed '" + compression->text + "' push of partition " +
                         std::to_string(header.part));
  item->spec.length = item->length = elements * sizeof(float);
  item->spec.compression = compression;
  try {
    item->block = pool_.Acquire(item->length);
  } catch (const std::bad_alloc&) {
    return Status::Error("no memory for a push of " + std::to_string(item->length) + " bytes");
  }
  compressor.Decompress(wire.data(), elements, reinterpret_cast<float*>(item->block.data.get()));
  return Status::OK();
}

Status Server::CheckPushLength(const FrameHeader& header, uint32_t rank,
                               const CompressionSetup** compression) {
  // A gather's first step carries at most every worker's split.
  uint64_t limit = AllgatherTableBytes(num_workers_);
  Declaration declared;
  const bool known = declarations_.Find(header.tensor_id, rank, &declared);
  if (header.op_kind == static_cast<uint8_t>(OpKind::kCompressedPushPull))
    return CheckCompressedPush(header, rank, known ? &declared : nullptr, compression);
  if (known) limit = std::max(limit, DeclaredBytes(declared));
  if (header.length <= limit) return Status::OK();
  return Status::Error("worker rank " + std::to_string(rank) + " pushed " +
                       std::to_string(header.length) + " bytes of tensor " +
                       declarations_.Describe(header.tensor_id, rank) + ", more than the " +
                       std::to_string(limit) + " it declared");
}

Status Server::CheckCompressedPush(const FrameHeader& header, uint32_t rank,
                                   const Declaration* declared,
                                   const CompressionSetup** compression) {
  const std::string from = "worker rank " + std::to_string(rank);
  if (!declared || declared->kind != OpKind::kCompressedPushPull ||
      declared->dtype != DataType::kFloat32 ||
      !FindCompression(declared->compression, compression).ok() || !(*compression)->compressor)
    return Status::Error(from + " sent a compressed push of tensor " +
                         declarations_.Describe(header.tensor_id, rank) +
                         " without declaring its compressor");
  // The element count bounds the decompressed partition: at most the tensor.
  const uint64_t elements = DeclaredBytes(*declared) / sizeof(float);
  if (header.rows <= 0 || static_cast<uint64_t>(header.rows) > elements ||
      header.rows > int64_t{UINT32_MAX} ||
      header.length != (*compression)->compressor->CompressedBytes(header.rows))
    return Status::Error(from + " pushed " + std::to_string(header.length) + " bytes for " +
                         std::to_string(header.rows) + " elements of tensor " +
                         declarations_.Describe(header.tensor_id, rank) + " compressed with '" +
                         (*compression)->text + "'");
  return Status::OK();
}

void Server::PushDone(uint32_t rank) {
  std::shared_ptr<WorkerConn> worker = ConnOf(rank);
  {
    std::lock_guard<std::mutex> lock(worker->mutex);
    --worker->outstanding;
  }
  worker->cv.notify_one();
}

void Server::Forgotten(uint32_t rank) {
  std::shared_ptr<WorkerConn> worker = ConnOf(rank);
  if (worker && --worker->forgetting == 0) worker->channel->ForgetPeerMemory();
}

bool Server::Joined(uint32_t rank, uint16_t) const {
  if (joined_any_.load() == 0) return false;
  std::lock_guard<std::mutex> lock(conns_mutex_);
  return joined_[rank];
}

bool Server::Gone(uint32_t rank) const {
  if (finished_count_.load() == 0) return false;
  std::lock_guard<std::mutex> lock(conns_mutex_);
  return finished_[rank];
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
  EnqueueEverywhere(EngineItem::Kind::kJoined);
  if (!everyone) return;
  {
    std::lock_guard<std::mutex> lock(join_report_mutex_);
    join_reports_pending_ = static_cast<int>(engines_.size());
    join_rounds_.clear();
  }
  EnqueueEverywhere(EngineItem::Kind::kJoinReport);
}

void Server::ReportRounds(const std::vector<std::pair<uint64_t, uint32_t>>& rounds) {
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
  for (int r = 0; r < num_workers_; ++r) Send(static_cast<uint32_t>(r), header, payload.data());
}

void Server::EnqueueEverywhere(EngineItem::Kind kind, uint32_t rank) {
  for (auto& engine : engines_) {
    EngineItem item;
    item.kind_of_item = kind;
    item.rank = rank;
    engine->Enqueue(std::move(item));
  }
}

void Server::LogTraffic() {
  if (!LogEnabled(LogLevel::kInfo)) return;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> by_tensor;  // id -> (in, out)
  for (auto& engine : engines_) engine->AddTraffic(&by_tensor);
  for (const auto& [tensor_id, traffic] : by_tensor) {
    // A compressed tensor's bytes are what its compression achieved: the operator's
    // measure of it, so they are told at INFO; the others only when debugging.
    Declaration declared;
    const bool compressed =
        declarations_.Find(tensor_id, 0, &declared) && declared.kind == OpKind::kCompressedPushPull;
    const LogLevel level = compressed ? LogLevel::kInfo : LogLevel::kDebug;
    if (!LogEnabled(level)) continue;
    LogLine(level) << "tensor " << declarations_.Describe(tensor_id, 0) << " moved "
                   << traffic.first << " bytes in and " << traffic.second << " bytes out";
  }
}

std::shared_ptr<Server::WorkerConn> Server::ConnOf(uint32_t rank) {
  std::lock_guard<std::mutex> lock(conns_mutex_);
  return conns_[rank];
}

bool Server::SharesMemory(uint32_t rank) {
  std::shared_ptr<WorkerConn> worker = ConnOf(rank);
  return worker && worker->channel->shares_memory();
}

void Server::Send(uint32_t rank, const FrameHeader& header, const void* payload) {
  std::shared_ptr<WorkerConn> worker = ConnOf(rank);
  if (!worker) return;
  Status status = worker->channel->Send(header, payload);
  if (status.ok()) metrics_->Sent(header.length);
  // A failed send needs no handling here: that worker's reader sees the broken
  // connection and fails the job with the reason.
  if (!status.ok()) BPS_LOG(kDebug) << status.message();
}

void Server::SendResult(uint32_t rank, const FrameHeader& header, const void* data) {
  std::shared_ptr<WorkerConn> worker = ConnOf(rank);
  const SlotKey slot{PartitionKey{header.tensor_id, header.part}};
  if (!worker) return;
  Status status = worker->channel->SendData(header, data, slot);
  if (status.ok()) metrics_->Sent(header.length);
  if (!status.ok()) BPS_LOG(kDebug) << status.message();  // As in Send.
}

void Server::SetFailure(const std::string& reason, int lost_worker) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failure_.empty()) return;
    failure_ = reason;
    lost_worker_ = lost_worker;
  }
  failed_.store(true);
  BPS_LOG(kError) << reason;
  char byte = 1;
  if (::write(failure_pipe_[1], &byte, 1) < 0) BPS_LOG(kWarning) << "cannot signal failure";
  // Rounds that wait for the lost worker can never finish. Their state belongs to
  // the engine threads, so ask each engine to fail its own.
  for (auto& engine : engines_) {
    EngineItem item;
    item.kind_of_item = EngineItem::Kind::kFailRounds;
    engine->EnqueueFirst(std::move(item));
  }
}

std::string Server::failure() {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

int Server::lost_worker() {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return lost_worker_;
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
  for (auto& engine : engines_) engine->Stop();
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
