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
Status AuthenticateCancellably(Channel& channel, int fd, const JobSecret& secret, uint32_t rank,
                               int timeout_ms, Cancellation* cancel) {
  std::string why;
  if (cancel && !cancel->Watch(fd)) {
    cancel->cancelled(&why);
    return Status::Error(ErrorKind::kAborted, why);
  }
  Status status = AuthenticateServer(channel, secret, rank, timeout_ms);
  if (cancel) {
    cancel->Unwatch(fd);
    if (cancel->cancelled(&why)) return Status::Error(ErrorKind::kAborted, why);
  }
  return status;
}

// One try at ConnectToServer. kPeerGone: the server closed the connection before its
// challenge, as it does while too many strangers wait for theirs; worth another try.
Status ConnectOnce(const ServerAddress& address, const std::string& peer, const JobSecret& secret,
                   uint32_t rank, int timeout_ms, std::unique_ptr<Channel>* out,
                   Cancellation* cancel, std::shared_ptr<SharedSlots> slots, uint32_t generation) {
  int fd = -1;
  if (address.same_host && ConnectLocal(ServerSocketName(address.port), timeout_ms, &fd).ok()) {
    if (!slots) slots = std::make_shared<SharedSlots>(std::make_shared<ArenaTable>());
    auto channel = std::make_unique<SharedMemoryChannel>(std::make_unique<Connection>(fd, peer),
                                                         slots, SharedMemoryChannel::Side::kWorker);
    channel->set_generation(generation);
    // Anyone on this host may have bound the socket's name first: trust it only once
    // it has proven the token, and otherwise take the TCP way in.
    Status status = AuthenticateCancellably(*channel, fd, secret, rank, timeout_ms, cancel);
    // Aborted, or refused for a setting the server does not share: TCP fares no better.
    if (status.kind() == ErrorKind::kAborted || status.kind() == ErrorKind::kInvalidArgument)
      return status;
    if (status.ok()) {
      BPS_LOG(kDebug) << peer << " is on this host: using its Unix socket and shared memory";
      *out = std::move(channel);
      return Status::OK();
    }
    if (status.kind() == ErrorKind::kPeerGone) {
      BPS_LOG(kDebug) << peer << " turned this worker away on its local socket ("
                      << status.message() << "); trying TCP";
    } else {
      BPS_LOG(kWarning) << "the local socket of " << peer << " is not the server's ("
                        << status.message() << "); using TCP";
    }
  }
  Status status = ConnectTcp(address.host, address.port, timeout_ms, timeout_ms, &fd, cancel);
  if (!status.ok()) return status;
  auto channel = std::make_unique<SocketChannel>(std::make_unique<Connection>(fd, peer));
  channel->set_generation(generation);
  status = AuthenticateCancellably(*channel, fd, secret, rank, timeout_ms, cancel);
  if (!status.ok()) return status;
  *out = std::move(channel);
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

Status Listener::Listen(const std::string& host, int port, int send_timeout_ms, int* bound_port) {
  send_timeout_ms_ = send_timeout_ms;
  Status status = ListenTcp(host, port, &tcp_fd_, bound_port);
  if (!status.ok()) return status;
  status = ListenLocal(ServerSocketName(*bound_port), &local_fd_);
  if (!status.ok()) BPS_LOG(kWarning) << status.message() << "; local workers will use TCP";
  return Status::OK();
}

Status Listener::Accept(std::unique_ptr<Channel>* out, int timeout_ms) {
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
          const auto now = std::chrono::steady_clock::now();
          if (now - last_refusal_log_ > std::chrono::seconds(10)) {
            BPS_LOG(kWarning) << "cannot accept a connection: " << std::strerror(errno);
            last_refusal_log_ = now;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        continue;
      }
      ConfigureSocket(fd, send_timeout_ms_);
      if (addr.ss_family == AF_UNIX) {
        *out = std::make_unique<SharedMemoryChannel>(
            std::make_unique<Connection>(fd, "a worker on this host"), shared_results_,
            SharedMemoryChannel::Side::kServer);
        (*out)->set_generation(generation_);
        return Status::OK();
      }
      std::string peer = "a worker";
      if (addr.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
        char host[INET_ADDRSTRLEN] = {0};
        ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        peer = std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
      }
      *out = std::make_unique<SocketChannel>(std::make_unique<Connection>(fd, peer));
      (*out)->set_generation(generation_);
      return Status::OK();
    }
  }
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
