// bps-server: the summation server as a native executable, with no Python and no
// TensorFlow, for CPU-only server machines. `bps-server`, `python -m tf_bps.control.server`
// and `DMLC_ROLE=server bpslaunch` all run this program.
//
// It reads the job's variables (control/settings.def, checked as config.py checks
// them), listens, registers with the scheduler, serves the workers of its address
// book, and heartbeats until the scheduler says the job is over (exit 0) or failing
// (exit 1). A bad variable exits with status 2 and config.py's message.
#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/logging.h"
#include "../control/scheduler_link.h"
#include "../control/settings.h"
#include "metrics_endpoint.h"
#include "server.h"
#include "server_metrics.h"

namespace bps {
namespace {

constexpr const char* kPrefix = "tf_bps server";

// The more verbose of BYTEPS_LOG_LEVEL and PS_VERBOSE (config.py's core_log_level).
LogLevel CoreLogLevel(const Settings& settings) {
  const std::string& name = settings.Text("BYTEPS_LOG_LEVEL");
  int level = name == "TRACE"     ? 0
              : name == "DEBUG"   ? 1
              : name == "INFO"    ? 2
              : name == "WARNING" ? 3
                                  : 4;
  const std::string& verbose = settings.Text("PS_VERBOSE");
  int from_verbose = verbose == "2" ? 0 : verbose == "1" ? 2 : 4;
  return static_cast<LogLevel>(std::min(level, from_verbose));
}

Status ConfigError(const std::string& message) {
  return Status::Error(ErrorKind::kInvalidArgument, message);
}

// The scheduler's address (config.py's require_rendezvous).
Status RequireRendezvous(const Settings& settings) {
  std::vector<std::string> missing;
  if (!settings.IsSet("DMLC_PS_ROOT_URI")) missing.push_back("DMLC_PS_ROOT_URI");
  if (!settings.IsSet("DMLC_PS_ROOT_PORT")) missing.push_back("DMLC_PS_ROOT_PORT");
  if (!missing.empty())
    return ConfigError(missing[0] + (missing.size() > 1 ? " and " + missing[1] : "") +
                       " must be set: a distributed job needs the scheduler's address (or "
                       "start the job with bpslaunch)");
  if (settings.Int("DMLC_NUM_SERVER") < 1)
    return ConfigError(
        "DMLC_NUM_SERVER must be set to at least 1: a distributed job needs servers");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  const std::string& uri = settings.Text("DMLC_PS_ROOT_URI");
  int rc = getaddrinfo(uri.c_str(), nullptr, &hints, &found);
  if (found) freeaddrinfo(found);
  if (rc != 0)
    return ConfigError("DMLC_PS_ROOT_URI=" + PythonRepr(uri) +
                       " is not valid: it does not resolve to an IPv4 address (" +
                       gai_strerror(rc) + ")");
  return Status::OK();
}

Status InterfaceAddress(const std::string& name, std::string* address) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ifreq request{};
  strncpy(request.ifr_name, name.c_str(), IFNAMSIZ - 1);
  int rc = ioctl(fd, SIOCGIFADDR, &request);
  int error = errno;
  close(fd);
  if (rc != 0)
    return ConfigError("DMLC_INTERFACE=" + PythonRepr(name) +
                       " is not valid: no IPv4 address on that interface (" + strerror(error) +
                       ")");
  *address = inet_ntoa(reinterpret_cast<sockaddr_in*>(&request.ifr_addr)->sin_addr);
  return Status::OK();
}

// The address workers reach this server at (config.py's advertised_host).
// BYTEPS_LOCAL_UIDS: user ids separated by commas (tf_bps/runtime/config.py reads it alike).
Status LocalUids(const Settings& settings, std::vector<uint32_t>* uids) {
  const std::string& text = settings.Text("BYTEPS_LOCAL_UIDS");
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string part = text.substr(start, end - start);
    part.erase(0, part.find_first_not_of(' '));
    part.erase(part.find_last_not_of(' ') + 1);
    start = end + 1;
    if (part.empty()) continue;
    const bool digits =
        part.size() <= 10 && part.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoull(part) >= 0xffffffffull)
      return Status::Error(ErrorKind::kInvalidArgument,
                           "BYTEPS_LOCAL_UIDS='" + text + "' is not valid: expected user ids "
                           "(numbers 0 to 4294967294) separated by commas");
    uids->push_back(static_cast<uint32_t>(std::stoull(part)));
  }
  return Status::OK();
}

Status AdvertisedHost(const Settings& settings, std::string* host) {
  if (settings.IsSet("DMLC_NODE_HOST")) {
    *host = settings.Text("DMLC_NODE_HOST");
    return Status::OK();
  }
  std::string interface = settings.Text("DMLC_INTERFACE");
  if (interface.empty()) interface = settings.Text("PERSEUS_GLOO_NETWORK_INTERFACE");
  if (!interface.empty()) return InterfaceAddress(interface, host);
  // Connecting a UDP socket sends nothing; it only asks the kernel for the route.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* root = nullptr;
  std::string port = std::to_string(settings.Int("DMLC_PS_ROOT_PORT"));
  if (getaddrinfo(settings.Text("DMLC_PS_ROOT_URI").c_str(), port.c_str(), &hints, &root) != 0)
    return ConfigError("DMLC_PS_ROOT_URI does not resolve");
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in mine{};
  socklen_t length = sizeof(mine);
  bool routed = connect(fd, root->ai_addr, root->ai_addrlen) == 0 &&
                getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &length) == 0;
  close(fd);
  freeaddrinfo(root);
  if (!routed) return Status::Error("no route to the scheduler at DMLC_PS_ROOT_URI");
  *host = inet_ntoa(mine.sin_addr);
  return Status::OK();
}

// `host` (a name or an address) as an IPv4 address in dots; "" if it does not resolve.
std::string Ipv4Of(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found) return "";
  const std::string address = inet_ntoa(reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr);
  freeaddrinfo(found);
  return address;
}

// The IPv4 address to listen on: the advertised `host` (a name is resolved) when it
// is one of this machine's, so strangers on other interfaces see no port; else ""
// (every interface: behind NAT, say). Binding succeeds only to a local address.
std::string ListenAddress(const std::string& host) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  if (inet_pton(AF_INET, Ipv4Of(host).c_str(), &address.sin_addr) != 1) return "";
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return bound ? inet_ntoa(address.sin_addr) : "";
}

// The sources the address book names for the job's workers, as the server reads a
// connection's (Server::Serve): their addresses, and "local" when one is on this
// machine (it comes through the Unix socket).
std::vector<std::string> NamedSources(const Json& book) {
  std::vector<std::string> named;
  for (const Json& host : book["workers"].items()) {
    const std::string address = Ipv4Of(host.str());
    if (address.empty()) continue;
    named.push_back(address);
    if (!ListenAddress(address).empty()) named.push_back("local");
  }
  return named;
}

// What the scheduler hears of a failure: enough to name it (and the lost worker's
// rank, for the job to re-form without it), never more than its messages may carry.
std::string FailureMessage(const std::string& reason, int lost_worker) {
  constexpr size_t kMaxReason = 4096;
  std::string text = reason.size() > kMaxReason ? reason.substr(0, kMaxReason) + "..." : reason;
  JsonWriter message;
  message.Add("type", "failure").Add("reason", text);
  if (lost_worker >= 0) message.Add("lost_rank", int64_t{lost_worker});
  return message.Finish();
}

// How one generation of the job ended for this server.
struct GenerationEnd {
  int exit_status = -1;  // 0: the job is over; 1: it failed; -1: it re-forms
  std::string reason;    // why it failed or re-forms
};

// Registers `server` (listening on `port`) for the next generation of the job and
// serves its workers until the scheduler ends or re-forms the job.
GenerationEnd ServeGeneration(Server& server, int port, const std::string& host,
                              SchedulerLink& link) {
  Json book;
  Status status = link.Register("server", host, JsonWriter().Add("port", int64_t{port}), &book);
  std::vector<int32_t> host_of_rank;
  for (const Json& group : book["merge_groups"].items()) {
    int64_t value = 0;
    if (!group.AsInt(0, INT32_MAX, &value)) {
      status = Status::Error("a malformed address book from the scheduler");
      break;
    }
    host_of_rank.push_back(static_cast<int32_t>(value));
  }
  int64_t server_id = -1, generation = 0;
  book["server_id"].AsInt(0, INT32_MAX, &server_id);
  book["generation"].AsInt(0, UINT32_MAX, &generation);
  if (status.ok())
    status = server.Serve(host_of_rank, static_cast<uint32_t>(generation), NamedSources(book));
  if (!status.ok()) {
    fprintf(stderr, "%s: %s\n", kPrefix, status.message().c_str());
    return {1, status.message()};
  }
  SetLogPrefix(std::string(kPrefix) + " " + std::to_string(server_id));
  BPS_LOG(kInfo) << "server " << server_id << " serving " << host_of_rank.size()
                 << " worker(s) on port " << port
                 << (generation ? " (job generation " + std::to_string(generation) + ")" : "");

  bool reported = false;
  while (true) {
    std::vector<Json> orders;
    bool failed = false;
    status = link.PollOnce(reported ? -1 : server.failure_fd(), &orders, &failed);
    if (!status.ok()) {
      fprintf(stderr, "%s: %s\n", kPrefix, status.message().c_str());
      return {1, ""};
    }
    if (!orders.empty()) {  // The first order stands: exit, abort or re-form.
      const Json& order = orders.front();
      const std::string& type = order["type"].str();
      if (type == "exit") return {0, ""};
      if (type == "reform") {
        BPS_LOG(kInfo) << "the job re-forms: " << order["reason"].str();
        return {-1, "the job is re-forming: " + order["reason"].str()};
      }
      fprintf(stderr, "%s: job aborted: %s\n", kPrefix, order["reason"].str().c_str());
      return {1, "the job is failing: " + order["reason"].str()};
    }
    if (failed && !reported) {
      // A lost link shows at the next poll. The scheduler answers with an abort, or
      // in an elastic job by re-forming it without the lost worker.
      (void)link.Send(FailureMessage(server.failure(), server.lost_worker()));
      reported = true;
    }
  }
}

// Serves one job, generation after generation; the exit status.
int Serve(const Settings& settings) {
  Status status = RequireRendezvous(settings);
  std::string host;
  if (status.ok()) status = AdvertisedHost(settings, &host);
  std::vector<uint32_t> local_uids;
  if (status.ok()) status = LocalUids(settings, &local_uids);
  if (!status.ok()) {
    fprintf(stderr, "%s: %s\n", kPrefix, status.message().c_str());
    return status.kind() == ErrorKind::kInvalidArgument ? 2 : 1;
  }
  const double timeout_s = settings.OperationTimeout();

  SetTrustedLocalUids(std::move(local_uids));
  ServerOptions options = ServerOptions::From(settings);
  options.host = settings.Flag("BYTEPS_LISTEN_ANY") ? "" : ListenAddress(host);

  // The Prometheus endpoint lives as long as the process, across the job's generations,
  // and so do its figures: counters never go back. Declared in this order, the endpoint
  // (whose thread reads the figures) ends before them, and every Server before both.
  ServerMetrics metrics;
  options.metrics = &metrics;
  MetricsEndpoint endpoint;
  if (settings.IsSet("BYTEPS_METRICS_PORT")) {
    // It listens where the server does (config.py's listen_host, as the workers' and
    // the scheduler's endpoints): every interface unless the advertised address is one
    // of this machine's.
    const int wanted = static_cast<int>(settings.Int("BYTEPS_METRICS_PORT"));
    int bound = 0;
    status = endpoint.Start(options.host, wanted, [&metrics] { return metrics.Render(); },
                            &bound);
    if (!status.ok()) {
      fprintf(stderr,
              "%s: BYTEPS_METRICS_PORT=%d: the server's Prometheus endpoint cannot listen "
              "there (%s)\n",
              kPrefix, wanted, status.message().c_str());
      return 2;
    }
    BPS_LOG(kWarning) << "metrics at http://" << host << ":" << bound << "/metrics";
  }

  SchedulerLinkOptions link_options;
  link_options.host = settings.Text("DMLC_PS_ROOT_URI");
  link_options.port = static_cast<int>(settings.Int("DMLC_PS_ROOT_PORT"));
  link_options.token = options.token;
  link_options.encrypt = options.encrypt;
  link_options.timeout_s = timeout_s;
  if (settings.IsSet("HOROVOD_START_TIMEOUT")) {
    link_options.timeout_s = settings.Number("HOROVOD_START_TIMEOUT");
    link_options.timeout_variable = "HOROVOD_START_TIMEOUT";
  }
  link_options.heartbeat_interval_s = settings.Number("PS_HEARTBEAT_INTERVAL");
  link_options.heartbeat_timeout_s = settings.Number("PS_HEARTBEAT_TIMEOUT");
  link_options.reform_timeout_s = settings.Number("BYTEPS_ELASTIC_TIMEOUT");
  link_options.num_workers = static_cast<int>(settings.Int("DMLC_NUM_WORKER"));
  link_options.num_servers = static_cast<int>(settings.Int("DMLC_NUM_SERVER"));
  std::unique_ptr<SchedulerLink> link;
  while (true) {
    // A fresh server each generation: nothing of the last one's rounds, connections
    // or declarations survives into the next. It listens where it did, and the
    // scheduler books the workers after it registered, so none finds it closed.
    Server server(options);
    int port = 0;
    status = server.Listen(&port);
    if (status.ok() && !link) {
      BPS_LOG(kInfo) << "listening on port " << port << "; registering";
      status = SchedulerLink::Connect(link_options, &link);
    }
    GenerationEnd end;
    if (status.ok()) {
      options.port = port;
      end = ServeGeneration(server, port, host, *link);
    } else {
      fprintf(stderr, "%s: %s\n", kPrefix, status.message().c_str());
      end = {1, status.message()};
    }
    std::string failure = server.failure();
    server.Stop(end.reason.empty() ? failure : end.reason);
    if (end.exit_status >= 0) {
      if (!failure.empty() && link) (void)link->Send(FailureMessage(failure, server.lost_worker()));
      return end.exit_status;
    }
  }
}

constexpr char kUsage[] =
    "usage: bps_server [--help | --version]\n"
    "\n"
    "The summation server of a tf_bps job: a native program with no Python and no\n"
    "TensorFlow, configured by the environment like every other node (DMLC_ROLE=server\n"
    "bpslaunch starts it too). What it reads:\n"
    "  DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT  the scheduler's address (required)\n"
    "  DMLC_NUM_WORKER, DMLC_NUM_SERVER     the job's size\n"
    "  BYTEPS_JOB_TOKEN                     the job's secret, proven both ways\n"
    "  BYTEPS_ENCRYPT=1                     encrypt every frame and control message\n"
    "  DMLC_NODE_HOST, DMLC_INTERFACE       the address workers reach it at\n"
    "  BYTEPS_SERVER_ENGINE_THREAD          summing threads\n"
    "  BYTEPS_OP_TIMEOUT, PS_HEARTBEAT_*    how long it waits\n"
    "  HOROVOD_START_TIMEOUT               how long it waits for the job to form\n"
    "  BYTEPS_ENABLE_ASYNC, BYTEPS_ELASTIC  the training mode\n"
    "  BYTEPS_LOG_LEVEL, PS_VERBOSE         how much it says\n"
    "  BYTEPS_METRICS_PORT                  its Prometheus endpoint (0: any free port)\n"
    "README.md, \"Configuration\", lists every variable.\n";

// --help and --version answer; anything else on the command line is a mistake (the
// configuration is the environment's). -1: go on and serve.
int CommandLine(int argc, char** argv) {
  if (argc < 2) return -1;
  const std::string flag = argv[1];
  if (argc == 2 && (flag == "--help" || flag == "-h")) {
    fputs(kUsage, stdout);
    return 0;
  }
  if (argc == 2 && flag == "--version") {
    printf("bps_server (tf_bps) %s\n", kVersion);
    return 0;
  }
  fprintf(stderr,
          "%s: unexpected argument %s: the server takes its settings from the "
          "environment\n%s",
          kPrefix, PythonRepr(flag).c_str(), kUsage);
  return 2;
}

int Main(int argc, char** argv) {
  const int answered = CommandLine(argc, argv);
  if (answered >= 0) return answered;
  // A peer that closes its socket must cost a connection, never the process.
  signal(SIGPIPE, SIG_IGN);
  Settings settings;
  Status status = Settings::FromEnvironment(&settings);
  if (status.ok() && settings.IsSet("DMLC_ROLE") && settings.Text("DMLC_ROLE") != "server")
    status = ConfigError("DMLC_ROLE=" + PythonRepr(settings.Text("DMLC_ROLE")) +
                         " but this is a server; set DMLC_ROLE=server");
  if (!status.ok()) {
    fprintf(stderr, "%s: %s\n", kPrefix, status.message().c_str());
    return 2;
  }
  SetLogLevel(CoreLogLevel(settings));
  SetLogPrefix(kPrefix);
  return Serve(settings);
}

}  // namespace
}  // namespace bps

int main(int argc, char** argv) { return bps::Main(argc, argv); }
