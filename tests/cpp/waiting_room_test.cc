// Unit tests of the waiting rooms: connections that have not yet said which worker
// they are, at a server or at a worker's local-merge socket. Strangers at one address
// cannot keep the job's workers out, a slow trickle is cut at the deadline, and a
// worker turned away tries again.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "../../custom_ops/server/server.h"
#include "../../custom_ops/worker/local_peers.h"
#include "../../custom_ops/wire/socket.h"
#include "../../custom_ops/wire/transport.h"
#include "expect.h"

namespace bps {
namespace {

constexpr char kSecret[] = "the waiting room's token";
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Opens a TCP connection that says nothing; -1 if it could not.
int IdleConnection(int port) {
  int fd = -1;
  return ConnectTcp("127.0.0.1", port, 2000, 2000, &fd).ok() ? fd : -1;
}

// An idle TCP connection to 127.0.0.1:`port` from the loopback address `source`
// (127.0.0.2, say: all of 127/8 is this machine); -1 if it could not.
int IdleConnectionFrom(const char* source, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
      inet_pton(AF_INET, "127.0.0.1", &to.sin_addr) != 1 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

// This process's threads, from /proc.
int ThreadCount() {
  FILE* status = std::fopen("/proc/self/status", "r");
  char line[256];
  int threads = -1;
  while (status && std::fgets(line, sizeof(line), status))
    if (std::sscanf(line, "Threads: %d", &threads) == 1) break;
  if (status) std::fclose(status);
  return threads;
}

// Seconds until the server closes `fd`, or -1 if it is still open after `limit_s`.
double SecondsUntilClosed(int fd, double limit_s, Clock::time_point since) {
  char byte;
  while (SecondsSince(since) < limit_s) {
    const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return SecondsSince(since);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// A server of `workers` workers (one per host) with an introduction deadline of
// `deadline_ms`, whose book names the workers' addresses `named`.
std::unique_ptr<Server> ServerWithDeadline(int workers, int* port, int deadline_ms = 1500,
                                           std::vector<std::string> named = {}) {
  ServerOptions options = ServerOptions::From(Settings::Defaults());
  options.token = kSecret;
  options.timeout_ms = 5000;
  options.hello_deadline_ms = deadline_ms;
  auto server = std::make_unique<Server>(options);
  std::vector<int32_t> host_of_rank;
  for (int r = 0; r < workers; ++r) host_of_rank.push_back(r);
  EXPECT(server->Listen(port).ok());
  EXPECT(server->Serve(host_of_rank, 0, std::move(named)).ok());
  return server;
}

void TestStrangersAtOneAddressCannotKeepWorkersOut() {
  int port = 0;
  std::unique_ptr<Server> server = ServerWithDeadline(2, &port);
  // A stranger opens 64 idle connections before the workers come: its address fills
  // its share of the waiting room, and the rest are refused.
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) idle.push_back(IdleConnection(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // A worker on this host comes in through the Unix socket at once.
  auto start = Clock::now();
  std::unique_ptr<Channel> local, tcp;
  EXPECT(ConnectToServer(ServerAddress{"127.0.0.1", port, true}, "server", kSecret, 0, 5000, &local)
             .ok());
  EXPECT(local && local->shares_memory() && SecondsSince(start) < 1.0);
  // One from the strangers' address is turned away until the deadline cuts them, and
  // then gets in by trying again.
  start = Clock::now();
  EXPECT(ConnectToServer(ServerAddress{"127.0.0.1", port, false}, "server", kSecret, 1, 5000, &tcp)
             .ok());
  const double waited = SecondsSince(start);
  EXPECT(tcp && !tcp->shares_memory() && waited > 0.5 && waited < 4.0);
  for (int fd : idle)
    if (fd >= 0) ::close(fd);
  server->Stop();
}

void TestAFullRoomTakesANamedWorkerBeforeStrangers() {
  int port = 0;
  // The deadline is long: nothing is cut by it during the test.
  std::unique_ptr<Server> server = ServerWithDeadline(1, &port, 30000, {"127.0.0.1"});
  const int threads = ThreadCount();
  // Strangers at four addresses the book does not name fill the room, 16 each.
  std::vector<int> strangers;
  for (const char* source : {"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"})
    for (int i = 0; i < 16; ++i) strangers.push_back(IdleConnectionFrom(source, port));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // They cost the server no thread: one polls them all.
  EXPECT(threads > 0 && ThreadCount() == threads);
  // A fifth stranger address finds it full.
  const int refused = IdleConnectionFrom("127.0.0.6", port);
  EXPECT(refused >= 0 && SecondsUntilClosed(refused, 2.0, Clock::now()) >= 0);
  // The worker, at the address its book names, gets in at once over TCP ...
  auto start = Clock::now();
  std::unique_ptr<Channel> tcp;
  EXPECT(ConnectToServer(ServerAddress{"127.0.0.1", port, false}, "server", kSecret, 0, 5000, &tcp)
             .ok());
  EXPECT(tcp && SecondsSince(start) < 1.0);
  // ... in place of the stranger that waited longest, whose connection is closed.
  EXPECT(strangers[0] >= 0 && SecondsUntilClosed(strangers[0], 2.0, Clock::now()) >= 0);
  EXPECT(SecondsUntilClosed(strangers[1], 0.2, Clock::now()) < 0);
  for (int fd : strangers)
    if (fd >= 0) ::close(fd);
  ::close(refused);
  server->Stop();
}

void TestTrickleIsCutAtTheDeadline() {
  int port = 0;
  std::unique_ptr<Server> server = ServerWithDeadline(1, &port);
  const int fd = IdleConnection(port);
  EXPECT(fd >= 0);
  const auto start = Clock::now();
  // One byte of a hello every 300 ms: each read succeeds, but the whole never does.
  std::thread trickle([fd] {
    for (int i = 0; i < 20; ++i) {
      const char byte = 0;
      if (::send(fd, &byte, 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  const double closed_after = SecondsUntilClosed(fd, 5.0, start);
  trickle.join();
  ::close(fd);
  // Cut at the deadline, and the server's check runs every second.
  EXPECT(closed_after >= 1.4 && closed_after < 3.0);
  server->Stop();
}

}  // namespace

// The workers of one host meet through the lower one's local socket: silent connections
// that reach it first wait in its room and cost the higher worker nothing.
void TestLocalMergeTakesItsPeerPastSilentConnections() {
  LocalMergeOptions options;
  options.ranks = {0, 1};
  options.size = 2;
  options.socket_prefix = "tf_bps-room-test-" + std::to_string(::getpid()) + "-";
  options.token = kSecret;
  options.timeout_ms = 20000;
  LocalMergeOptions lower = options, higher = options;
  higher.rank = 1;
  LocalPeers first(lower, std::make_shared<SharedSlots>(std::make_shared<ArenaTable>()));
  LocalPeers second(higher, std::make_shared<SharedSlots>(std::make_shared<ArenaTable>()));
  Status accepted = Status::OK();
  std::thread accepting([&] { accepted = first.Connect(0, nullptr); });
  std::vector<int> silent;
  while (silent.size() < 3) {
    int fd = -1;
    if (ConnectLocal(options.socket_prefix + "0", 1000, &fd).ok()) {
      silent.push_back(fd);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  const auto start = Clock::now();
  const Status connected = second.Connect(1, nullptr);
  accepting.join();
  EXPECT(connected.ok() && accepted.ok());
  EXPECT(SecondsSince(start) < 2.0);
  EXPECT(first.peer(1) != nullptr && second.peer(0) != nullptr);
  for (int fd : silent) ::close(fd);
}

void TestWaitingRoom() {
  TestStrangersAtOneAddressCannotKeepWorkersOut();
  TestAFullRoomTakesANamedWorkerBeforeStrangers();
  TestTrickleIsCutAtTheDeadline();
  TestLocalMergeTakesItsPeerPastSilentConnections();
}

}  // namespace bps
