// tf_bps._bps_worker: the worker side of the core for Python (init, abort, shutdown).
// It calls the core only through its C API, like the TensorFlow kernels do, and
// releases the GIL around every call that may block on the network.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../worker/c_api.h"
#include "errors.h"

namespace py = pybind11;

namespace {

void Check(int result) {
  if (result != 0)
    throw bps::CoreError(bps_last_error_kind(), bps_last_error());
}

std::string Failure() {
  char buffer[4096];
  const int length = bps_worker_failure(buffer, sizeof(buffer));
  return std::string(buffer, std::min<size_t>(length, sizeof(buffer) - 1));
}

// bps_worker_init with Python's lists: each server as (host, port, same_host), and the
// job's variables as config.py read them, "NAME=value" each.
void Init(int rank, int size, const std::vector<std::tuple<std::string, int, bool>>& servers,
          const std::string& token, const std::vector<std::string>& settings,
          const std::vector<int>& local_ranks, const std::string& local_socket_prefix,
          bool across_hosts, const std::vector<int>& server_shares, unsigned generation,
          bool move_lost_servers, int notify_fd) {
  std::vector<bps_server_address> addresses;
  for (const auto& [host, port, same_host] : servers)
    addresses.push_back({host.c_str(), port, same_host ? 1 : 0});
  if (!server_shares.empty() && server_shares.size() != servers.size())
    throw std::invalid_argument("server_shares: one per server, or none");
  std::vector<const char*> entries;
  for (const std::string& entry : settings) entries.push_back(entry.c_str());
  bps_worker_config config{};
  config.rank = rank;
  config.size = size;
  config.servers = addresses.data();
  config.num_servers = static_cast<int>(addresses.size());
  config.token = token.c_str();
  config.local_ranks = local_ranks.data();
  config.num_local_ranks = static_cast<int>(local_ranks.size());
  config.local_socket_prefix = local_socket_prefix.c_str();
  config.across_hosts = across_hosts ? 1 : 0;
  config.server_shares = server_shares.empty() ? nullptr : server_shares.data();
  config.generation = generation;
  config.move_lost_servers = move_lost_servers ? 1 : 0;
  config.notify_fd = notify_fd;
  config.settings = entries.data();
  config.num_settings = static_cast<int>(entries.size());
  int result;
  {
    py::gil_scoped_release unlocked;  // Connecting may take up to the timeout.
    result = bps_worker_init(&config);
  }
  Check(result);
}

// bps_worker_read_stats, as a dict of the struct's fields.
py::dict ReadStats() {
  bps_worker_stats stats;
  bps_worker_read_stats(&stats);
  py::list counts;
  for (const auto& by_latency : stats.push_pull_counts)
    counts.append(std::vector<unsigned long long>(std::begin(by_latency), std::end(by_latency)));
  py::dict out;
  out["steps"] = stats.steps;
  out["step_seconds_sum"] = stats.step_seconds_sum;
  out["last_step_seconds"] = stats.last_step_seconds;
  out["last_step_time"] = stats.last_step_time;
  out["pushed_bytes"] = stats.pushed_bytes;
  out["pushed_raw_bytes"] = stats.pushed_raw_bytes;
  out["pulled_bytes"] = stats.pulled_bytes;
  out["failed_operations"] = stats.failed_operations;
  out["push_pull_counts"] = counts;
  out["push_pull_seconds"] = std::vector<double>(std::begin(stats.push_pull_seconds),
                                                 std::end(stats.push_pull_seconds));
  return out;
}

// bps_control_keys: (node to scheduler, scheduler to node).
py::tuple ControlKeys(const std::string& token, const std::string& scheduler_nonce,
                      const std::string& node_nonce) {
  unsigned char keys[64];
  Check(bps_control_keys(token.c_str(), scheduler_nonce.c_str(), node_nonce.c_str(), keys));
  return py::make_tuple(py::bytes(reinterpret_cast<char*>(keys), 32),
                        py::bytes(reinterpret_cast<char*>(keys) + 32, 32));
}

const unsigned char* Key(const std::string& key) {
  if (key.size() != 32) throw std::invalid_argument("a key is 32 bytes");
  return reinterpret_cast<const unsigned char*>(key.data());
}

py::bytes SealMessage(const std::string& key, unsigned long long sequence,
                      const std::string& clear) {
  std::string sealed(clear.size() + 16, '\0');
  Check(bps_seal_message(Key(key), sequence, clear.data(), static_cast<int>(clear.size()),
                         sealed.data()));
  return py::bytes(sealed);
}

// None when `sealed` does not authenticate.
py::object OpenMessage(const std::string& key, unsigned long long sequence,
                       const std::string& sealed) {
  if (sealed.size() < 16) return py::none();
  std::string clear(sealed.size() - 16, '\0');
  if (bps_open_message(Key(key), sequence, sealed.data(), static_cast<int>(sealed.size()),
                       clear.data()) != 0)
    return py::none();
  return py::bytes(clear);
}

// The gradient compressors (custom_ops/compression) through the C API, for tests
// against models of their formats. A bad spec or malformed data raises ValueError with
// the core's message.
void CheckCompression(long long result) {
  if (result < 0) throw py::value_error(bps_last_error());
}

// The canonical text of a spec (what workers declare), or ValueError naming what is wrong.
std::string CanonicalCompression(const std::string& text) {
  char canonical[1024];
  CheckCompression(bps_compression_canonical(text.c_str(), canonical, sizeof(canonical)));
  return canonical;
}

// float32 elements from a float32 array (C-contiguous) or from bytes.
std::vector<float> FloatsOf(const py::buffer& values) {
  const py::buffer_info info = values.request();
  const bool floats = info.itemsize == 4 && (info.format == "f" || info.format == "<f");
  if (!floats && info.itemsize != 1)
    throw py::value_error("compression: values must be a float32 array or bytes");
  py::ssize_t stride = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != stride)
      throw py::value_error("compression: values must be contiguous");
    stride *= info.shape[d];
  }
  const size_t bytes = static_cast<size_t>(info.size) * info.itemsize;
  if (bytes % 4 != 0) throw py::value_error("compression: bytes must hold float32 elements");
  std::vector<float> out(bytes / 4);
  if (bytes != 0) std::memcpy(out.data(), info.ptr, bytes);
  return out;
}

py::bytes Compress(const std::string& spec, const py::buffer& values, uint64_t stream,
                   uint32_t round) {
  const std::vector<float> in = FloatsOf(values);
  const long long bytes = bps_compressed_bytes(spec.c_str(), in.size());
  CheckCompression(bytes);
  std::string out(static_cast<size_t>(bytes), '\0');
  CheckCompression(bps_compress(spec.c_str(), in.data(), in.size(), stream, round, out.data()));
  return py::bytes(out);
}

py::bytes Decompress(const std::string& spec, const std::string& data, size_t n) {
  // The length is checked before `n` elements are allocated: a wrong one fails the call
  // before it writes anything.
  const long long expected = bps_compressed_bytes(spec.c_str(), n);
  CheckCompression(expected);
  if (static_cast<size_t>(expected) != data.size())
    CheckCompression(bps_decompress(spec.c_str(), data.data(), data.size(), n, nullptr));
  std::vector<float> out(n);
  CheckCompression(bps_decompress(spec.c_str(), data.data(), data.size(), n, out.data()));
  return py::bytes(reinterpret_cast<const char*>(out.data()), 4 * n);
}

}  // namespace

PYBIND11_MODULE(_bps_worker, m) {
  m.doc() = "The tf_bps worker engine (C++ core) for Python.";
  bps::RegisterCoreError(m);
  m.def(
      "set_local_uids",
      [](const std::vector<unsigned int>& uids) {
        bps_set_local_uids(uids.data(), static_cast<int>(uids.size()));
      },
      py::arg("uids"));
  m.def(
      "set_logging",
      [](int level, const std::string& prefix) { bps_set_logging(level, prefix.c_str()); },
      py::arg("level"), py::arg("prefix"),
      "Log level of the core (0 trace .. 4 error) and the prefix of its lines.");
  m.def(
      "device_use", [](const std::string& library) { Check(bps_device_use(library.c_str())); },
      py::arg("library"),
      "Loads the device table of the core's CUDA library at `library` (\"\": host memory "
      "standing in for a device); once per process, before init.");
  m.def(
      "device_table", [] { return std::string(bps_device_table()); },
      "The name of the device table in use; empty before any.");
  m.def(
      "init_local", [] { Check(bps_worker_init_local()); },
      "One worker and no servers: every collective is local.");
  m.def("control_keys", &ControlKeys, py::arg("token"), py::arg("scheduler_nonce"),
        py::arg("node_nonce"),
        "A registration's keys (BYTEPS_ENCRYPT): (node to scheduler, "
        "scheduler to node).");
  m.def("seal_message", &SealMessage, py::arg("key"), py::arg("sequence"), py::arg("clear"),
        "Seals one control message as number `sequence`.");
  m.def("open_message", &OpenMessage, py::arg("key"), py::arg("sequence"), py::arg("sealed"),
        "The clear text of a sealed control message, or None if it does not authenticate.");
  m.def(
      "init", &Init, py::arg("rank"), py::arg("size"), py::arg("servers"), py::arg("token"),
      py::arg("settings") = std::vector<std::string>{}, py::arg("local_ranks") = std::vector<int>{},
      py::arg("local_socket_prefix") = "", py::arg("across_hosts") = false,
      py::arg("server_shares") = std::vector<int>{}, py::arg("generation") = 0,
      py::arg("move_lost_servers") = false, py::arg("notify_fd") = -1,
      "Connects to the servers ((host, port, same_host) each) and, with several local "
      "ranks, to the other workers of this host; `settings` (\"NAME=value\" each, as "
      "config.py read them) give the job's variables, the table's defaults the rest.");
  m.def(
      "abort",
      [](const std::string& reason) {
        // Called from the heartbeat thread while the main thread may be shutting the
        // core down: holding the GIL here would keep the main thread from ever
        // returning from shutdown's join.
        py::gil_scoped_release unlocked;
        bps_worker_abort(reason.c_str());
      },
      py::arg("reason"), "Fails every operation in flight and to come with `reason`.");
  m.def(
      "start_timeline",
      [](const std::string& path, int first_step, int last_step) {
        int result;
        {
          py::gil_scoped_release unlocked;  // Waits for the file of a recording it ends.
          result = bps_worker_start_timeline(path.c_str(), first_step, last_step);
        }
        Check(result);
      },
      py::arg("path"), py::arg("first_step") = 1, py::arg("last_step") = 0,
      "Records the timeline of the operations that start from now on, of those steps "
      "(last_step 0: no end), into the file `path`; a recording in progress ends, and "
      "its file is written before this returns.");
  m.def(
      "stop_timeline",
      [] {
        int result;
        {
          py::gil_scoped_release unlocked;  // Waits for the recorded operations to end.
          result = bps_worker_stop_timeline();
        }
        Check(result);
      },
      "Ends the recording in progress and returns once its file is written.");
  m.def(
      "declare",
      [](const std::vector<std::string>& names) {
        std::vector<const char*> pointers;
        for (const std::string& name : names) pointers.push_back(name.c_str());
        Check(bps_worker_declare(pointers.data(), static_cast<int>(pointers.size())));
      },
      py::arg("names"), "Gives the tensors their priority in this order (earlier goes first).");
  m.def(
      "set_process_set",
      [](int id, const std::vector<int>& ranks) {
        Check(bps_worker_set_process_set(id, ranks.data(), static_cast<int>(ranks.size())));
      },
      py::arg("id"), py::arg("ranks"),
      "Registers process set `id` here and at every server; no ranks removes it.");
  m.def(
      "join",
      [] {
        int last = -1, result;
        {
          py::gil_scoped_release unlocked;  // Waits for every other worker.
          result = bps_worker_join(&last);
        }
        Check(result);
        return last;
      },
      "Blocks until every worker has joined; returns the last rank to join.");
  m.def("failure", &Failure, "Why the worker can no longer communicate; empty while healthy.");
  m.def(
      "lost_servers",
      [] {
        std::vector<int> lost(64);
        const int count = bps_worker_lost_servers(lost.data(), static_cast<int>(lost.size()));
        lost.resize(std::min<size_t>(count, lost.size()));
        return lost;
      },
      "The indices of the servers that went away without a word, in that order.");
  m.def(
      "move_lost_server", [](int server) { Check(bps_worker_move_lost_server(server)); },
      py::arg("server"), "The scheduler says the server is gone: its partitions move.");
  m.def("compress", &Compress, py::arg("spec"), py::arg("values"), py::arg("stream") = 0,
        py::arg("round") = 0,
        "The compressed form (bytes) of float32 `values` (an array or bytes) under the "
        "compressor `spec` (\"topk k=0.01\", ...), as partition `stream` of `round`.");
  m.def("canonical_compression", &CanonicalCompression, py::arg("spec"),
        "The canonical text of compressor `spec` (ValueError naming what is wrong).");
  m.def("decompress", &Decompress, py::arg("spec"), py::arg("data"), py::arg("n"),
        "The n float32 elements (bytes) that compressed `data` stands for.");
  m.def("read_stats", &ReadStats,
        "What this process's workers have done (bps_worker_stats in c_api.h) as a dict; "
        "push_pull_counts: per size class, the finished push_pulls per latency bucket.");
  m.def(
      "stats_bounds",
      [] {
        const unsigned long long* sizes = bps_stats_size_bounds();
        const double* latencies = bps_stats_latency_bounds();
        return py::make_tuple(
            std::vector<unsigned long long>(sizes, sizes + BPS_STATS_SIZE_CLASSES - 1),
            std::vector<double>(latencies, latencies + BPS_STATS_LATENCY_BUCKETS - 1));
      },
      "The upper bounds of the size classes (bytes) and latency buckets (seconds).");
  m.def(
      "shutdown",
      [] {
        py::gil_scoped_release unlocked;  // Joins the core's threads.
        bps_worker_shutdown();
      },
      "Says goodbye to the servers and stops the core's threads.");
}
