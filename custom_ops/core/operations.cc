#include "operations.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>

#include "../server/server.h"
#include "c_api.h"
#include "logging.h"
#include "worker.h"

namespace bps {
namespace {

// What bps.init() set up. Shared pointers let an op in flight outlive shutdown().
struct WorkerState {
  std::mutex mutex;
  bool initialised = false;
  std::shared_ptr<Worker> worker;  // null on the single-worker local path.
};

WorkerState& State() {
  static WorkerState* state = new WorkerState();  // Never destroyed: ops may finish at exit.
  return *state;
}

thread_local std::string t_last_error;

int Fail(const std::string& message) {
  t_last_error = message;
  return -1;
}

int CopyOut(const std::string& text, char* buf, int capacity) {
  if (capacity > 0) std::snprintf(buf, static_cast<size_t>(capacity), "%s", text.c_str());
  return static_cast<int>(text.size());
}

Status ParseServers(const char* text, std::vector<ServerAddress>* servers) {
  std::stringstream list(text ? text : "");
  std::string item;
  // Entries are host:port, with "+local" appended for a server on this host.
  while (std::getline(list, item, ',')) {
    ServerAddress address;
    const size_t suffix = item.find("+local");
    address.same_host = suffix != std::string::npos;
    if (address.same_host) item.resize(suffix);
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos) return Status::Error("bad server address '" + item + "'");
    address.host = item.substr(0, colon);
    address.port = std::atoi(item.c_str() + colon + 1);
    servers->push_back(address);
  }
  if (servers->empty()) return Status::Error("the server list is empty");
  return Status::OK();
}

}  // namespace

void EnqueuePushPull(const TensorView& view, const std::string& name, ReduceOp op,
                     DoneCallback done) {
  std::shared_ptr<Worker> worker;
  {
    WorkerState& state = State();
    std::lock_guard<std::mutex> lock(state.mutex);
    if (!state.initialised) {
      done(Status::Error("tf_bps is not initialised: call bps.init() before push_pull (tensor '" +
                         name + "')"));
      return;
    }
    worker = state.worker;
  }
  if (!worker) {  // One worker: the sum over workers is the tensor itself.
    if (view.output != view.input) std::memcpy(view.output, view.input, view.bytes);
    done(Status::OK());
    return;
  }
  worker->PushPull(view, name, op, std::move(done));
}

}  // namespace bps

using bps::Status;

extern "C" {

const char* bps_last_error(void) { return bps::t_last_error.c_str(); }

void bps_set_logging(int level, const char* prefix) {
  bps::SetLogLevel(static_cast<bps::LogLevel>(level));
  if (prefix) bps::SetLogPrefix(prefix);
}

int bps_worker_init_local(void) {
  auto& state = bps::State();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.initialised) return bps::Fail("tf_bps is already initialised");
  state.initialised = true;
  return 0;
}

int bps_worker_init(int rank, int size, const char* servers, long long partition_bytes,
                    int timeout_ms) {
  bps::WorkerOptions options;
  options.rank = rank;
  options.size = size;
  options.partition_bytes = static_cast<size_t>(partition_bytes);
  options.timeout_ms = timeout_ms;
  Status status = bps::ParseServers(servers, &options.servers);
  if (!status.ok()) return bps::Fail(status.message());
  auto& state = bps::State();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.initialised) return bps::Fail("tf_bps is already initialised");
  auto worker = std::make_shared<bps::Worker>(options);
  status = worker->Start();
  if (!status.ok()) return bps::Fail(status.message());
  state.worker = std::move(worker);
  state.initialised = true;
  return 0;
}

void bps_worker_abort(const char* reason) {
  std::shared_ptr<bps::Worker> worker;
  {
    auto& state = bps::State();
    std::lock_guard<std::mutex> lock(state.mutex);
    worker = state.worker;
  }
  if (worker) worker->Abort(reason ? reason : "aborted");
}

int bps_worker_failure(char* buf, int capacity) {
  std::shared_ptr<bps::Worker> worker;
  {
    auto& state = bps::State();
    std::lock_guard<std::mutex> lock(state.mutex);
    worker = state.worker;
  }
  return bps::CopyOut(worker ? worker->fatal_error().message() : "", buf, capacity);
}

void bps_worker_shutdown(void) {
  std::shared_ptr<bps::Worker> worker;
  {
    auto& state = bps::State();
    std::lock_guard<std::mutex> lock(state.mutex);
    worker.swap(state.worker);
    state.initialised = false;
  }
  if (worker) worker->Stop();
}

void* bps_server_listen(int port, int engine_threads, int timeout_ms, int* bound_port) {
  bps::ServerOptions options;
  options.port = port;
  options.engine_threads = engine_threads;
  options.timeout_ms = timeout_ms;
  auto server = std::make_unique<bps::Server>(options);
  Status status = server->Listen(bound_port);
  if (!status.ok()) {
    bps::Fail(status.message());
    return nullptr;
  }
  return server.release();
}

int bps_server_serve(void* server, int num_workers) {
  Status status = static_cast<bps::Server*>(server)->Serve(num_workers);
  return status.ok() ? 0 : bps::Fail(status.message());
}

int bps_server_failure_fd(void* server) { return static_cast<bps::Server*>(server)->failure_fd(); }

int bps_server_failure(void* server, char* buf, int capacity) {
  return bps::CopyOut(static_cast<bps::Server*>(server)->failure(), buf, capacity);
}

void bps_server_stop(void* server) { delete static_cast<bps::Server*>(server); }

}  // extern "C"
