#include "c_api.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../common/logging.h"
#include "../common/reduce.h"
#include "c_api_errors.h"
#include "device.h"
#include "stats.h"
#include "task.h"
#include "worker.h"

namespace bps {

// The C enums are the core's own values (the operation kinds are by construction).
static_assert(BPS_FLOAT16 == static_cast<int>(DataType::kFloat16) &&
              BPS_BFLOAT16 == static_cast<int>(DataType::kBFloat16) &&
              BPS_FLOAT32 == static_cast<int>(DataType::kFloat32) &&
              BPS_FLOAT64 == static_cast<int>(DataType::kFloat64) &&
              BPS_INT32 == static_cast<int>(DataType::kInt32) &&
              BPS_INT64 == static_cast<int>(DataType::kInt64) &&
              BPS_UINT8 == static_cast<int>(DataType::kUint8) &&
              BPS_INT8 == static_cast<int>(DataType::kInt8) &&
              BPS_UINT16 == static_cast<int>(DataType::kUint16) &&
              BPS_INT16 == static_cast<int>(DataType::kInt16) &&
              BPS_BOOL == static_cast<int>(DataType::kBool));
static_assert(BPS_SUM == static_cast<int>(ReduceOp::kSum) &&
              BPS_AVERAGE == static_cast<int>(ReduceOp::kAverage) &&
              BPS_MIN == static_cast<int>(ReduceOp::kMin) &&
              BPS_MAX == static_cast<int>(ReduceOp::kMax) &&
              BPS_PRODUCT == static_cast<int>(ReduceOp::kProduct));
static_assert(BPS_OK == static_cast<int>(ErrorKind::kOk) &&
              BPS_INVALID_ARGUMENT == static_cast<int>(ErrorKind::kInvalidArgument) &&
              BPS_MISMATCH == static_cast<int>(ErrorKind::kMismatch) &&
              BPS_PEER_GONE == static_cast<int>(ErrorKind::kPeerGone) &&
              BPS_ABORTED == static_cast<int>(ErrorKind::kAborted) &&
              BPS_TIMEOUT == static_cast<int>(ErrorKind::kTimeout) &&
              BPS_INTERNAL == static_cast<int>(ErrorKind::kInternal) &&
              BPS_SHUTDOWN == static_cast<int>(ErrorKind::kShutdown));

namespace {

// What bps.init() set up. Shared pointers let an op in flight outlive shutdown().
struct WorkerState {
  std::mutex mutex;
  bool initialised = false;
  std::shared_ptr<Worker> worker;    // null on the single-worker local path.
  std::shared_ptr<Worker> starting;  // connecting to its servers: an abort may stop it.
  // The job's abort when it came before any worker existed (bps.init() hears from the
  // scheduler before it starts connecting): the next init fails with it at once.
  std::string early_abort;
  // The device table bps_device_use loaded; null: host tensors only.
  std::shared_ptr<Devices> devices;
};

WorkerState& State() {
  static WorkerState* state = new WorkerState();  // Never destroyed: ops may finish at exit.
  return *state;
}

// This process's figures, one set for every engine an elastic job makes as it re-forms
// (stats.h). Never destroyed, as State().
const std::shared_ptr<WorkerStats>& ProcessStats() {
  static auto* stats = new std::shared_ptr<WorkerStats>(std::make_shared<WorkerStats>());
  return *stats;
}

// The worker bps.init() set up (null on the single-worker local path); false
// before init. A copy of the pointer, so the call can go on without the lock.
bool CurrentWorker(std::shared_ptr<Worker>* worker) {
  WorkerState& state = State();
  std::lock_guard<std::mutex> lock(state.mutex);
  *worker = state.worker;
  return state.initialised;
}

int CopyOut(const std::string& text, char* buf, int capacity) {
  if (capacity > 0) std::snprintf(buf, static_cast<size_t>(capacity), "%s", text.c_str());
  return static_cast<int>(text.size());
}

Status CopyServers(const bps_worker_config& config, std::vector<ServerAddress>* servers) {
  if (config.num_servers < 1 || !config.servers) return Status::Error("the server list is empty");
  for (int i = 0; i < config.num_servers; ++i) {
    const bps_server_address& given = config.servers[i];
    if (!given.host || !*given.host || given.port <= 0 || given.port > 65535)
      return Status::Error(ErrorKind::kInvalidArgument, "bad address of server " +
                                                            std::to_string(i) + ": '" +
                                                            (given.host ? given.host : "") + ":" +
                                                            std::to_string(given.port) + "'");
    servers->push_back(ServerAddress{given.host, given.port, given.same_host != 0});
  }
  return Status::OK();
}

// One share per server, none over kMaxShare, not all zero.
Status CopyShares(const int* given, size_t num_servers, std::vector<uint32_t>* shares) {
  constexpr int kMaxShare = 1000;  // keeps the servers' cycle short
  if (!given) return Status::OK();
  bool any = false, bad = false;
  std::string text;
  for (size_t i = 0; i < num_servers; ++i) {
    bad = bad || given[i] < 0 || given[i] > kMaxShare;
    any = any || given[i] > 0;
    shares->push_back(static_cast<uint32_t>(std::max(0, given[i])));
    text += (i ? "," : "") + std::to_string(given[i]);
  }
  if (bad || !any)
    return Status::Error(ErrorKind::kInvalidArgument,
                         "bad server shares '" + text + "': want " + std::to_string(num_servers) +
                             " integers from 0 to " + std::to_string(kMaxShare) + ", not all 0");
  return Status::OK();
}

Status CopyRanks(const int* given, int count, std::vector<int32_t>* ranks) {
  if (count < 0 || (count > 0 && !given))
    return Status::Error(ErrorKind::kInvalidArgument, "a malformed local rank list");
  for (int i = 0; i < count; ++i) {
    if (given[i] < 0 || (i > 0 && given[i] <= given[i - 1]))
      return Status::Error(ErrorKind::kInvalidArgument,
                           "local ranks must ascend from 0 or more (rank " +
                               std::to_string(given[i]) + " at " + std::to_string(i) + ")");
    ranks->push_back(given[i]);
  }
  return Status::OK();
}

}  // namespace

// One worker and no servers, on a device: the output is the input, scaled, copied on
// the engine's stream after the caller's work; the caller's stream then waits for it.
void RunLocallyOnDevice(const TaskSpec& spec, const AllocateFn& allocate, const DoneFn& done) {
  std::shared_ptr<Devices> devices;
  {
    std::lock_guard<std::mutex> lock(State().mutex);
    devices = State().devices;
  }
  if (!devices)
    return done(Status::Error(ErrorKind::kInvalidArgument,
                              "tensor '" + spec.op.name +
                                  "' is in device memory, and no device library is loaded "
                                  "(bps_device_use)"));
  const int device = spec.place.device;
  const bps_device_api& api = devices->api();
  void* output = spec.output;
  void* engine = nullptr;
  Status status = devices->Stream(device, &engine);
  if (status.ok() && !output) output = allocate(0, spec.op.shape, &status);
  if (status.ok() && spec.op.kind == OpKind::kAlltoall) {
    const int64_t received = spec.op.shape[0];
    void* splits = allocate(1, {1}, &status);
    if (splits) std::memcpy(splits, &received, sizeof(received));
  }
  if (!status.ok()) return done(status);
  const size_t count = spec.bytes / DataTypeSize(spec.op.dtype);
  const double factor = spec.op.prescale * spec.op.postscale;
  const int dtype = static_cast<int>(spec.op.dtype);
  bool queued = api.stream_wait(device, engine, spec.place.stream) == 0;
  if (queued && output != spec.input)
    queued = api.copy(device, output, spec.input, spec.bytes, engine) == 0;
  if (queued && IsReduction(spec.op.kind) && factor != 1.0)
    queued = api.scale(device, output, count, dtype, factor, engine) == 0;
  // Whatever was queued, the caller's stream waits for it before reusing the memory.
  const bool waits = api.stream_wait(device, spec.place.stream, engine) == 0;
  if (!queued || !waits)
    return done(devices->Failure("tensor '" + spec.op.name + "'", device));
  status = devices->WhenDone(device, [done] { done(Status::OK()); });
  if (!status.ok()) done(status);
}

// One worker and no servers: every collective is the tensor itself (scaled).
void RunLocally(const TaskSpec& spec, const AllocateFn& allocate, const DoneFn& done) {
  void* output = spec.output;
  Status status = Status::OK();
  if (!output) output = allocate(0, spec.op.shape, &status);
  if (status.ok() && spec.op.kind == OpKind::kAlltoall) {
    const int64_t received = spec.op.shape[0];
    void* splits = allocate(1, {1}, &status);
    if (splits) std::memcpy(splits, &received, sizeof(received));
  }
  if (!status.ok()) return done(status);
  if (output != spec.input && spec.bytes) std::memcpy(output, spec.input, spec.bytes);
  if (IsReduction(spec.op.kind))
    ScaleInPlace(spec.op.dtype, output, spec.bytes / DataTypeSize(spec.op.dtype),
                 spec.op.prescale * spec.op.postscale);
  done(Status::OK());
}

Status ToTaskSpec(const bps_op* op, TaskSpec* spec) {
  if (!op || !op->name || op->ndims < 0 || (op->ndims > 0 && !op->shape))
    return Status::Error(ErrorKind::kInvalidArgument, "malformed operation request");
  if (!IsValidOpKind(static_cast<uint8_t>(op->kind)) || op->kind > 255)
    return Status::Error(
        ErrorKind::kInvalidArgument,
        "unknown operation kind " + std::to_string(op->kind) + " for tensor '" + op->name + "'");
  if (op->dtype < 0 || op->dtype > 255 || !IsValidDataType(static_cast<uint8_t>(op->dtype)))
    return Status::Error(ErrorKind::kInvalidArgument,
                         "unsupported dtype for tensor '" + std::string(op->name) + "'");
  if (op->reduce_op < 0 || !IsValidReduceOp(static_cast<uint8_t>(op->reduce_op)))
    return Status::Error(ErrorKind::kInvalidArgument,
                         "unknown reduce op for tensor '" + std::string(op->name) + "'");
  Declaration& d = spec->op;
  d.name = op->name;
  d.kind = static_cast<OpKind>(op->kind);
  d.dtype = static_cast<DataType>(op->dtype);
  d.reduce_op = static_cast<ReduceOp>(op->reduce_op);
  d.root_rank = op->root_rank;
  d.prescale = op->prescale;
  d.postscale = op->postscale;
  d.shape.assign(op->shape, op->shape + op->ndims);
  spec->input = op->input;
  spec->output = op->output;
  if (op->on_device) {
    if (op->device < 0)
      return Status::Error(ErrorKind::kInvalidArgument,
                           "device " + std::to_string(op->device) + " of tensor '" + d.name +
                               "' is not a device ordinal");
    spec->place.device = op->device;
    spec->place.stream = op->stream;
  }
  spec->bytes = static_cast<size_t>(op->bytes);
  if (op->nsplits < 0 || (op->nsplits > 0 && !op->splits))
    return Status::Error(ErrorKind::kInvalidArgument,
                         "malformed splits for tensor '" + d.name + "'");
  spec->splits.assign(op->splits, op->splits + op->nsplits);
  if (op->process_set < 0)
    return Status::Error(ErrorKind::kInvalidArgument,
                         "a negative process set id for tensor '" + d.name + "'");
  d.process_set = static_cast<uint32_t>(op->process_set);
  // Adapters ask for a push_pull with a compressor; the core picks the wire's kind.
  if (d.kind == OpKind::kCompressedPushPull)
    return Status::Error(ErrorKind::kInvalidArgument,
                         "ask for a push_pull with a compressor (tensor '" + d.name + "')");
  d.compression = op->compression ? op->compression : "";
  return Status::OK();
}

}  // namespace bps

using bps::Status;

extern "C" {

const char* bps_op_kind_name(int kind) {
  if (kind < 0 || kind > 255 || !bps::IsValidOpKind(static_cast<uint8_t>(kind))) return "unknown";
  return bps::OpKindName(static_cast<bps::OpKind>(kind));
}

const char* bps_error_kind_name(int kind) {
  if (kind < 0 || kind > static_cast<int>(bps::ErrorKind::kShutdown)) return "unknown";
  return bps::ErrorKindName(static_cast<bps::ErrorKind>(kind));
}

const char* bps_last_error(void) { return bps::LastCallError().message().c_str(); }

int bps_last_error_kind(void) { return static_cast<int>(bps::LastCallError().kind()); }

void bps_set_logging(int level, const char* prefix) {
  bps::SetLogLevel(static_cast<bps::LogLevel>(level));
  if (prefix) bps::SetLogPrefix(prefix);
}

void bps_set_local_uids(const unsigned int* uids, int count) {
  bps::SetTrustedLocalUids(std::vector<uint32_t>(uids, uids + std::max(count, 0)));
}

int bps_worker_init_local(void) {
  auto& state = bps::State();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.initialised) return bps::Fail("tf_bps is already initialised");
  state.initialised = true;
  return 0;
}

int bps_worker_init(const bps_worker_config* config) {
  if (!config) return bps::Fail("no worker configuration");
  auto text = [](const char* value) { return std::string(value ? value : ""); };
  std::vector<std::string> entries;
  for (int i = 0; config->settings && i < config->num_settings; ++i)
    entries.push_back(text(config->settings[i]));
  bps::Settings settings;
  Status status = bps::Settings::FromEntries(entries, &settings);
  if (!status.ok()) return bps::Fail(status);
  bps::WorkerOptions options;
  options.ReadSettings(std::move(settings));
  options.token = text(config->token);
  options.local_socket_prefix = text(config->local_socket_prefix);
  status = bps::CopyRanks(config->local_ranks, config->num_local_ranks, &options.local_ranks);
  if (!status.ok()) return bps::Fail(status);
  options.rank = config->rank;
  options.size = config->size;
  options.across_hosts = config->across_hosts != 0;
  options.generation = config->generation;
  options.move_lost_servers = config->move_lost_servers != 0;
  options.notify_fd = config->notify_fd;
  options.stats = bps::ProcessStats();
  status = bps::CopyServers(*config, &options.servers);
  if (!status.ok()) return bps::Fail(status);
  status = bps::CopyShares(config->server_shares, options.servers.size(), &options.server_shares);
  if (!status.ok()) return bps::Fail(status);
  auto& state = bps::State();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    options.devices = state.devices;
  }
  if (options.devices)
    BPS_LOG(kInfo) << "tensors in device memory are staged through the "
                   << options.devices->api().name << " table";
  auto worker = std::make_shared<bps::Worker>(options);
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (state.initialised || state.starting) return bps::Fail("tf_bps is already initialised");
    if (!state.early_abort.empty()) {
      const std::string reason = std::move(state.early_abort);
      state.early_abort.clear();
      return bps::Fail(Status::Error(bps::ErrorKind::kAborted, reason));
    }
    state.starting = worker;
  }
  status = worker->Start();  // Without the lock: bps_worker_abort may stop it.
  std::lock_guard<std::mutex> lock(state.mutex);
  state.starting.reset();
  if (!status.ok()) return bps::Fail(status);
  state.worker = std::move(worker);
  state.initialised = true;
  return 0;
}

int bps_device_use(const char* library) {
  const bps_device_api* api = bps::HostStandInDevice();
  if (library && *library) {
    void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!handle) return bps::Fail(std::string("cannot load the device library: ") + dlerror());
    auto table = reinterpret_cast<bps_device_api_fn>(dlsym(handle, "bps_gpu_device_api"));
    if (!table)
      return bps::Fail(std::string(library) + " has no device table (bps_gpu_device_api)");
    api = table();
  }
  auto& state = bps::State();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.devices) {
    if (&state.devices->api() == api) return 0;
    return bps::Fail(std::string("the ") + state.devices->api().name +
                     " device table is in use already");
  }
  state.devices = std::make_shared<bps::Devices>(api);
  return 0;
}

const char* bps_device_table(void) {
  auto& state = bps::State();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.devices ? state.devices->api().name : "";
}

void bps_worker_abort(const char* reason) {
  std::shared_ptr<bps::Worker> worker;
  {
    auto& state = bps::State();
    std::lock_guard<std::mutex> lock(state.mutex);
    worker = state.worker ? state.worker : state.starting;
    if (!worker) state.early_abort = reason && *reason ? reason : "aborted";
  }
  if (worker) worker->Abort(reason ? reason : "aborted");
}

int bps_worker_lost_servers(int* out, int capacity) {
  std::shared_ptr<bps::Worker> worker;
  bps::CurrentWorker(&worker);
  if (!worker) return 0;
  const std::vector<int> lost = worker->lost_servers();
  for (int i = 0; i < capacity && i < static_cast<int>(lost.size()); ++i) out[i] = lost[i];
  return static_cast<int>(lost.size());
}

int bps_worker_move_lost_server(int server) {
  std::shared_ptr<bps::Worker> worker;
  bps::CurrentWorker(&worker);
  if (!worker) return bps::Fail(Status::Error(bps::ErrorKind::kShutdown, "tf_bps is not running"));
  Status status = worker->MoveLostServer(server);
  return status.ok() ? 0 : bps::Fail(status);
}

int bps_worker_failure(char* buf, int capacity) {
  std::shared_ptr<bps::Worker> worker;
  bps::CurrentWorker(&worker);
  return bps::CopyOut(worker ? worker->fatal_error().message() : "", buf, capacity);
}

void bps_enqueue(const bps_op* op, bps_allocate_fn allocate, bps_done_fn done, void* ctx) {
  auto finish = [done, ctx](const Status& status) {
    done(ctx, static_cast<int>(status.kind()), status.message().c_str());
  };
  bps::TaskSpec spec;
  Status status = bps::ToTaskSpec(op, &spec);
  if (!status.ok()) return finish(status);
  bps::AllocateFn allocate_output = [allocate, ctx](int index, const std::vector<int64_t>& shape,
                                                    Status* status) -> void* {
    std::vector<long long> dims(shape.begin(), shape.end());
    void* out =
        allocate ? allocate(ctx, index, dims.data(), static_cast<int>(dims.size())) : nullptr;
    if (!out)
      *status = Status::Error(bps::ErrorKind::kInternal, "the framework refused the output");
    return out;
  };
  std::shared_ptr<bps::Worker> worker;
  if (!bps::CurrentWorker(&worker))
    return finish(Status::Error(
        bps::ErrorKind::kShutdown,
        "tf_bps is not initialised: call bps.init() first (tensor '" + spec.op.name + "')"));
  if (!worker) {
    bps::Group alone;  // One worker: every process set is {0}.
    alone.ranks = {0};
    status = bps::CheckTaskSpec(spec, alone);
    if (status.ok() && spec.op.kind == bps::OpKind::kAsyncPushPull)
      status = Status::Error(bps::ErrorKind::kInvalidArgument,
                             "asynchronous training of tensor '" + spec.op.name +
                                 "' needs servers: the parameters live there");
    if (!status.ok()) return finish(status);
    if (spec.place.on_device()) return bps::RunLocallyOnDevice(spec, allocate_output, finish);
    return bps::RunLocally(spec, allocate_output, finish);
  }
  worker->Enqueue(std::move(spec), std::move(allocate_output), std::move(finish));
}

void bps_set_learning_rate(double learning_rate) {
  std::shared_ptr<bps::Worker> worker;
  if (learning_rate > 0 && bps::CurrentWorker(&worker) && worker)
    worker->SetLearningRate(learning_rate);
}

int bps_worker_start_timeline(const char* path, int first_step, int last_step) {
  if (!path || !*path || first_step < 1 || (last_step != 0 && last_step < first_step))
    return bps::Fail("malformed timeline request");
  std::shared_ptr<bps::Worker> worker;
  if (!bps::CurrentWorker(&worker))
    return bps::Fail(Status::Error(bps::ErrorKind::kShutdown, "tf_bps is not initialised"));
  if (worker)
    worker->StartTimeline(path, static_cast<uint32_t>(first_step),
                          last_step ? static_cast<uint32_t>(last_step) : bps::Timeline::kEveryStep);
  return 0;
}

int bps_worker_stop_timeline(void) {
  std::shared_ptr<bps::Worker> worker;
  if (!bps::CurrentWorker(&worker))
    return bps::Fail(Status::Error(bps::ErrorKind::kShutdown, "tf_bps is not initialised"));
  if (worker) worker->StopTimeline();
  return 0;
}

int bps_worker_declare(const char* const* names, int count) {
  if (count < 0 || (count > 0 && !names)) return bps::Fail("malformed tensor declaration");
  std::shared_ptr<bps::Worker> worker;
  if (!bps::CurrentWorker(&worker))
    return bps::Fail(Status::Error(bps::ErrorKind::kShutdown, "tf_bps is not initialised"));
  if (!worker) return 0;  // One worker: nothing is scheduled.
  std::vector<std::string> declared;
  for (int i = 0; i < count; ++i) {
    if (!names[i]) return bps::Fail("malformed tensor declaration");
    declared.emplace_back(names[i]);
  }
  worker->Declare(declared);
  return 0;
}

int bps_worker_set_process_set(int id, const int* ranks, int count) {
  if (id <= 0 || count < 0 || (count > 0 && !ranks))
    return bps::Fail("malformed process set registration");
  std::shared_ptr<bps::Worker> worker;
  if (!bps::CurrentWorker(&worker))
    return bps::Fail(Status::Error(bps::ErrorKind::kShutdown, "tf_bps is not initialised"));
  if (!worker) return 0;  // One worker: nothing to tell anyone.
  Status status =
      worker->SetProcessSet(static_cast<uint32_t>(id), std::vector<int32_t>(ranks, ranks + count));
  return status.ok() ? 0 : bps::Fail(status);
}

int bps_worker_join(int* last_rank) {
  std::shared_ptr<bps::Worker> worker;
  if (!bps::CurrentWorker(&worker))
    return bps::Fail(Status::Error(bps::ErrorKind::kShutdown, "tf_bps is not initialised"));
  if (!worker) {  // One worker: it is the last to join.
    *last_rank = 0;
    return 0;
  }
  Status status = worker->Join(last_rank);
  return status.ok() ? 0 : bps::Fail(status);
}

int bps_worker_rank(void) {
  auto& state = bps::State();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.initialised) return -1;
  return state.worker ? state.worker->options().rank : 0;
}

void bps_worker_shutdown(void) {
  std::shared_ptr<bps::Worker> worker;
  {
    auto& state = bps::State();
    std::lock_guard<std::mutex> lock(state.mutex);
    worker.swap(state.worker);
    state.initialised = false;
    state.early_abort.clear();
  }
  if (worker) worker->Stop();
}

}  // extern "C"

void bps_worker_read_stats(bps_worker_stats* out) { bps::ProcessStats()->Read(out); }

const unsigned long long* bps_stats_size_bounds(void) {
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "the bounds are read in place");
  return reinterpret_cast<const unsigned long long*>(bps::WorkerStats::kSizeBounds.data());
}

const double* bps_stats_latency_bounds(void) { return bps::WorkerStats::kLatencyBounds.data(); }
