// tf_bps._bps_server: the server engine for Python's `bps-server`. It holds the
// engine itself (no worker code, no TensorFlow), so a server process loads nothing else.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "../core/logging.h"
#include "../server/server.h"
#include "errors.h"

namespace py = pybind11;

namespace {

// Listens from construction, so that its port can be registered with the scheduler,
// and serves once the scheduler has said how many workers the job has.
class ServerEngine {
 public:
  ServerEngine(int engine_threads, int timeout_ms, const std::string& token,
               uint64_t max_tensor_bytes, const std::string& host, int port, bool enable_async) {
    bps::ServerOptions options;
    options.enable_async = enable_async;
    options.max_tensor_bytes = max_tensor_bytes;
    options.host = host;
    options.port = port;
    options.engine_threads = engine_threads;
    options.timeout_ms = timeout_ms;
    options.token = token;
    server_ = std::make_unique<bps::Server>(options);
    bps::ThrowIfError(server_->Listen(&port_));
  }

  int port() const { return port_; }
  void Serve(const std::vector<int32_t>& host_of_rank) {
    bps::ThrowIfError(Get().Serve(host_of_rank));
  }
  int FailureFd() { return Get().failure_fd(); }
  std::string Failure() { return Get().failure(); }
  void Stop(const std::string& reason) {
    py::gil_scoped_release unlocked;  // Joins the engine's threads.
    if (server_) server_->Stop(reason);
    server_.reset();
  }

 private:
  bps::Server& Get() {
    if (!server_)
      throw bps::CoreError(bps::ErrorKind::kShutdown, "the server engine has been stopped");
    return *server_;
  }

  std::unique_ptr<bps::Server> server_;
  int port_ = 0;
};

}  // namespace

PYBIND11_MODULE(_bps_server, m) {
  m.doc() = "The tf_bps server engine (C++) for Python.";
  bps::RegisterCoreError(m);
  m.def(
      "set_logging",
      [](int level, const std::string& prefix) {
        bps::SetLogLevel(static_cast<bps::LogLevel>(level));
        bps::SetLogPrefix(prefix);
      },
      py::arg("level"), py::arg("prefix"));
  py::class_<ServerEngine>(m, "ServerEngine")
      .def(py::init<int, int, const std::string&, uint64_t, const std::string&, int, bool>(),
           py::arg("engine_threads"), py::arg("timeout_ms"), py::arg("token"),
           py::arg("max_tensor_bytes"), py::arg("host") = "", py::arg("port") = 0,
           py::arg("enable_async") = false)
      .def_property_readonly("port", &ServerEngine::port)
      .def("serve", &ServerEngine::Serve, py::arg("host_of_rank"),
           "Starts serving the job's workers; `host_of_rank` numbers each worker's host.")
      .def("failure_fd", &ServerEngine::FailureFd,
           "A descriptor that turns readable when the server hits a fatal failure.")
      .def("failure", &ServerEngine::Failure)
      .def("stop", &ServerEngine::Stop, py::arg("reason") = "",
           "Stops serving; with a reason, every worker hears it first.");
}
