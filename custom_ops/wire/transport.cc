// The Channel base and the socket transport, and how a connection gets its channel.
#include "transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "../common/logging.h"
#include "auth.h"

namespace bps {

// ---------------------------------------------------------------------------
// DataReader

DataReader DataReader::OfStream(Connection* stream, size_t bytes) {
  DataReader reader;
  reader.stream_ = stream;
  reader.remaining_ = bytes;
  return reader;
}

DataReader DataReader::OfMemory(const char* memory, size_t bytes) {
  DataReader reader;
  reader.memory_ = memory;
  reader.lasting_ = true;
  reader.remaining_ = bytes;
  return reader;
}

Status DataReader::OpenSealed() {
  if (!failure_.ok() || !stream_ || !stream_->sealed()) return failure_;
  Connection* stream = stream_;
  stream_ = nullptr;
  if (remaining_ > 0) failure_ = stream->OpenPayload(remaining_, &memory_);
  if (!failure_.ok()) remaining_ = 0;
  return failure_;
}

const char* DataReader::View(size_t bytes) {
  if (!lasting_ || !memory_ || bytes > remaining_) return nullptr;
  const char* view = memory_;
  memory_ += bytes;
  remaining_ -= bytes;
  return view;
}

Status DataReader::Read(void* dst, size_t bytes) {
  Status status = OpenSealed();
  if (!status.ok()) return status;
  if (bytes > remaining_)
    return Status::Error("a frame's payload is shorter than its reader asked");
  remaining_ -= bytes;
  if (memory_) {
    if (bytes) std::memcpy(dst, memory_, bytes);
    memory_ += bytes;
    return Status::OK();
  }
  return bytes ? stream_->ReceivePayload(dst, bytes) : Status::OK();
}

Status DataReader::Skip() {
  Status status = OpenSealed();  // Checked even unread: the next record counts on it.
  const size_t rest = remaining_;
  remaining_ = 0;
  if (!status.ok() || memory_ || rest == 0) return status;
  return stream_->DiscardPayload(rest);
}

// ---------------------------------------------------------------------------
// Channel

Status Channel::Send(const FrameHeader& header, const void* payload) {
  std::lock_guard<std::mutex> lock(write_mutex_);
  SendControlLocked();
  return conn_->Send(header, payload);
}

Status Channel::ReceiveFromSocket(FrameHeader* header, DataReader* payload, bool* eof) {
  Status status = conn_->ReceiveHeader(header, eof);
  *payload = DataReader::OfStream(conn_.get(), status.ok() ? header->length : 0);
  return status;
}

Status SocketChannel::SendData(FrameHeader header, const void* data, const SlotKey&) {
  return Send(header, data);
}

Status SocketChannel::Receive(FrameHeader* header, DataReader* payload, bool* eof) {
  return ReceiveFromSocket(header, payload, eof);
}

// ---------------------------------------------------------------------------
// Connecting and listening

namespace {

// The handshake, with the socket shut down if `cancel` fires meanwhile.
Status AuthenticateCancellably(Connection& connection, const JobSecret& secret, uint32_t rank,
                               int timeout_ms, Cancellation* cancel) {
  std::string why;
  if (cancel && !cancel->Watch(connection.fd())) {
    cancel->cancelled(&why);
    return Status::Error(ErrorKind::kAborted, why);
  }
  Status status = AuthenticateServer(connection, secret, rank, timeout_ms);
  if (cancel) {
    cancel->Unwatch(connection.fd());
    if (cancel->cancelled(&why)) return Status::Error(ErrorKind::kAborted, why);
  }
  return status;
}

// The server's Unix socket and shared memory, if a process of a trusted uid listens on
// it and proves the token within the handshake's one deadline. Anything else (no such
// socket, another uid, a refusal, garbage, silence) is not taken as our server's word:
// the caller goes the TCP way, where the real server answers. Null then.
std::unique_ptr<Channel> ConnectLocally(const ServerAddress& address, const std::string& peer,
                                        const JobSecret& secret, uint32_t rank, int timeout_ms,
                                        Cancellation* cancel, std::shared_ptr<SharedSlots> slots,
                                        uint32_t generation, Status* aborted) {
  int fd = -1;
  Status status = ConnectLocal(ServerSocketName(secret.token, address.port), timeout_ms, &fd);
  if (!status.ok()) {  // None there (the server's host has no Unix socket for us) is no news.
    if (status.kind() != ErrorKind::kPeerGone)
      BPS_LOG(kWarning) << "the local socket of " << peer << " is not the server's ("
                        << status.message() << "); using TCP";
    return nullptr;
  }
  auto connection = std::make_unique<Connection>(fd, peer);
  connection->set_generation(generation);
  status = AuthenticateCancellably(*connection, secret, rank, timeout_ms, cancel);
  if (status.kind() == ErrorKind::kAborted) {
    *aborted = status;
    return nullptr;
  }
  if (status.kind() == ErrorKind::kPeerGone) {  // Closed before its challenge: a full room.
    BPS_LOG(kDebug) << peer << " turned this worker away on its local socket ("
                    << status.message() << "); trying TCP";
    return nullptr;
  }
  if (!status.ok()) {
    BPS_LOG(kWarning) << "the local socket of " << peer << " did not prove to be the server's ("
                      << status.message() << "); using TCP";
    return nullptr;
  }
  BPS_LOG(kDebug) << peer << " is on this host: using its Unix socket and shared memory";
  if (!slots) slots = std::make_shared<SharedSlots>(std::make_shared<ArenaTable>());
  return std::make_unique<SharedMemoryChannel>(std::move(connection), std::move(slots),
                                               SharedMemoryChannel::Side::kWorker);
}

// One try at ConnectToServer. kPeerGone: the server closed the connection before its
// challenge, as it does while too many strangers wait for theirs; worth another try.
Status ConnectOnce(const ServerAddress& address, const std::string& peer, const JobSecret& secret,
                   uint32_t rank, int timeout_ms, std::unique_ptr<Channel>* out,
                   Cancellation* cancel, std::shared_ptr<SharedSlots> slots, uint32_t generation) {
  if (address.same_host) {
    Status aborted = Status::OK();
    *out = ConnectLocally(address, peer, secret, rank, timeout_ms, cancel, slots, generation,
                          &aborted);
    if (*out || !aborted.ok()) return aborted;
  }
  int fd = -1;
  Status status = ConnectTcp(address.host, address.port, timeout_ms, timeout_ms, &fd, cancel);
  if (!status.ok()) return status;
  auto connection = std::make_unique<Connection>(fd, peer);
  connection->set_generation(generation);
  status = AuthenticateCancellably(*connection, secret, rank, timeout_ms, cancel);
  if (!status.ok()) return status;
  *out = std::make_unique<SocketChannel>(std::move(connection));
  return Status::OK();
}

}  // namespace

Status ConnectToServer(const ServerAddress& address, const std::string& peer,
                       const JobSecret& secret, uint32_t rank, int timeout_ms,
                       std::unique_ptr<Channel>* out, Cancellation* cancel,
                       std::shared_ptr<SharedSlots> slots, uint32_t generation) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto backoff = std::chrono::milliseconds(50);
  for (int tries = 1;; ++tries) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    Status status = ConnectOnce(address, peer, secret, rank,
                                static_cast<int>(std::max<int64_t>(left.count(), 1)), out, cancel,
                                slots, generation);
    if (status.ok() || status.kind() != ErrorKind::kPeerGone) return status;
    // Turned away: strangers may hold the server's waiting room. They are cut at
    // its deadline, so try again until ours.
    if (Clock::now() + backoff >= deadline)
      return status.WithSuffix(" (" + peer + " turned this worker away " + std::to_string(tries) +
                               " time(s) until BYTEPS_OP_TIMEOUT ran out)");
    std::string why;
    if (cancel && cancel->cancelled(&why)) return Status::Error(ErrorKind::kAborted, why);
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

Listener::Listener()
    : shared_results_(std::make_shared<SharedSlots>(std::make_shared<ArenaTable>())) {}

Listener::~Listener() {
  Close();
  for (int fd : {tcp_fd_, local_fd_})
    if (fd >= 0) ::close(fd);
}

Status Listener::Listen(const std::string& host, int port, int send_timeout_ms,
                        const std::string& token, int* bound_port) {
  send_timeout_ms_ = send_timeout_ms;
  Status status = ListenTcp(host, port, &tcp_fd_, bound_port);
  if (!status.ok()) return status;
  status = ListenLocal(ServerSocketName(token, *bound_port), &local_fd_);
  if (!status.ok()) BPS_LOG(kWarning) << status.message() << "; local workers will use TCP";
  return Status::OK();
}

void Listener::WarnAtMostEvery10s(const std::string& text) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_refusal_log_ < std::chrono::seconds(10)) return;
  BPS_LOG(kWarning) << text;
  last_refusal_log_ = now;
}

Status Listener::Accept(std::unique_ptr<Connection>* out, bool* local, int timeout_ms) {
  pollfd listeners[2] = {{tcp_fd_, POLLIN, 0}, {local_fd_, POLLIN, 0}};
  const nfds_t count = local_fd_ >= 0 ? 2 : 1;
  while (true) {
    const int ready = ::poll(listeners, count, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Status::Error(std::string("poll() on the listening sockets failed: ") +
                           std::strerror(errno));
    }
    if (ready == 0) return Status::Error(ErrorKind::kTimeout, "no connection came");
    for (nfds_t i = 0; i < count; ++i) {
      if (listeners[i].revents & (POLLERR | POLLHUP | POLLNVAL))
        return Status::Error(ErrorKind::kShutdown, "the listener is closed");
      if (!(listeners[i].revents & POLLIN)) continue;
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(listeners[i].fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: the waiting peer stays queued, and polling again at
          // once would spin. Serve the connections we have and retry shortly.
          WarnAtMostEvery10s(std::string("cannot accept a connection: ") + std::strerror(errno));
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        continue;
      }
      *local = addr.ss_family == AF_UNIX;
      if (*local) {
        Status trusted = CheckLocalPeer(fd);
        if (!trusted.ok()) {
          WarnAtMostEvery10s("refused a connection to the local socket: " + trusted.message());
          ::close(fd);
          continue;
        }
      }
      ConfigureSocket(fd, send_timeout_ms_);
      std::string peer = *local ? "a worker on this host" : "a worker";
      if (addr.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
        char host[INET_ADDRSTRLEN] = {0};
        ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        peer = std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
      }
      *out = std::make_unique<Connection>(fd, peer);
      (*out)->set_generation(generation_);
      return Status::OK();
    }
  }
}

std::unique_ptr<Channel> Listener::ChannelOf(std::unique_ptr<Connection> connection, bool local) {
  if (local)
    return std::make_unique<SharedMemoryChannel>(std::move(connection), shared_results_,
                                                 SharedMemoryChannel::Side::kServer);
  return std::make_unique<SocketChannel>(std::move(connection));
}

std::vector<int> Listener::fds() const {
  std::vector<int> open;
  for (int fd : {tcp_fd_, local_fd_})
    if (fd >= 0) open.push_back(fd);
  return open;
}

void Listener::Close() {
  for (int fd : {tcp_fd_, local_fd_})
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

}  // namespace bps
