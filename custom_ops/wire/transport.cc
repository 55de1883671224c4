// The transports' common ground: a payload's reader, a worker's connection by the
// first transport that carries it, and a server's listening on every transport.
#include "transport.h"

#include <errno.h>
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
// Connecting

Status ProveServer(Connection& connection, const ConnectRequest& request) {
  Cancellation* cancel = request.cancel;
  std::string why;
  if (cancel && !cancel->Watch(connection.fd())) {
    cancel->cancelled(&why);
    return Status::Error(ErrorKind::kAborted, why);
  }
  Status status =
      AuthenticateServer(connection, request.secret, request.rank, request.timeout_ms);
  if (cancel) {
    cancel->Unwatch(connection.fd());
    if (cancel->cancelled(&why)) return Status::Error(ErrorKind::kAborted, why);
  }
  return status;
}

namespace {

// One try at ConnectToServer: the transports that reach the server, in order, until
// one connects; a transport that is not required leaves the server to the next one
// unless the job aborted. kPeerGone: the server closed the connection before its
// challenge, as it does while too many strangers wait for theirs; worth another try.
Status ConnectOnce(const ConnectRequest& request, std::unique_ptr<Channel>* out) {
  Status status = Status::Error(ErrorKind::kPeerGone, "no transport reaches " + request.peer);
  for (const Transport* transport : RegisteredTransports()) {
    if (!transport->Reaches(request.address)) continue;
    status = transport->Connect(request, out);
    if (status.ok() || status.kind() == ErrorKind::kAborted || transport->required())
      return status;
  }
  return status;
}

}  // namespace

Status ConnectToServer(const ServerAddress& address, const std::string& peer,
                       const JobSecret& secret, uint32_t rank, int timeout_ms,
                       std::unique_ptr<Channel>* out, Cancellation* cancel,
                       std::shared_ptr<SharedSlots> slots, uint32_t generation) {
  using Clock = std::chrono::steady_clock;
  ConnectRequest request{address, peer, secret, rank, timeout_ms, cancel, std::move(slots),
                         generation};
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto backoff = std::chrono::milliseconds(50);
  for (int tries = 1;; ++tries) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    request.timeout_ms = static_cast<int>(std::max<int64_t>(left.count(), 1));
    Status status = ConnectOnce(request, out);
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

// ---------------------------------------------------------------------------
// Listening

Listener::Listener()
    : shared_results_(std::make_shared<SharedSlots>(std::make_shared<ArenaTable>())) {}

Listener::~Listener() {
  Close();
  for (const Door& door : doors_) ::close(door.fd);
}

Status Listener::Listen(const std::string& host, int port, int send_timeout_ms,
                        const std::string& token, int* bound_port) {
  send_timeout_ms_ = send_timeout_ms;
  // The required transports first: they fix the port the others are named after.
  for (bool required : {true, false}) {
    for (const Transport* transport : RegisteredTransports()) {
      if (transport->required() != required) continue;
      int fd = -1;
      Status status = transport->Listen(host, &port, token, &fd);
      if (status.ok()) {
        doors_.push_back(Door{transport, fd});
      } else if (required) {
        return status;
      } else {
        BPS_LOG(kWarning) << status.message();
      }
    }
  }
  *bound_port = port;
  return Status::OK();
}

void Listener::WarnAtMostEvery10s(const std::string& text) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_refusal_log_ < std::chrono::seconds(10)) return;
  BPS_LOG(kWarning) << text;
  last_refusal_log_ = now;
}

Status Listener::Accept(std::unique_ptr<Connection>* out, std::string* source, int* door,
                        int timeout_ms) {
  std::vector<pollfd> listeners;
  for (const Door& each : doors_) listeners.push_back({each.fd, POLLIN, 0});
  while (true) {
    const int ready = ::poll(listeners.data(), listeners.size(), timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Status::Error(std::string("poll() on the listening sockets failed: ") +
                           std::strerror(errno));
    }
    if (ready == 0) return Status::Error(ErrorKind::kTimeout, "no connection came");
    for (size_t i = 0; i < listeners.size(); ++i) {
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
      std::string peer;
      Status admitted = doors_[i].transport->Admit(fd, addr, &peer, source);
      if (!admitted.ok()) {
        WarnAtMostEvery10s(admitted.message());
        ::close(fd);
        continue;
      }
      ConfigureSocket(fd, send_timeout_ms_);
      *out = std::make_unique<Connection>(fd, peer);
      (*out)->set_generation(generation_);
      *door = static_cast<int>(i);
      return Status::OK();
    }
  }
}

std::unique_ptr<Channel> Listener::ChannelOf(std::unique_ptr<Connection> connection, int door) {
  return doors_.at(door).transport->ServerChannel(std::move(connection), shared_results_);
}

std::vector<int> Listener::fds() const {
  std::vector<int> open;
  for (const Door& door : doors_) open.push_back(door.fd);
  return open;
}

void Listener::Close() {
  for (const Door& door : doors_) ::shutdown(door.fd, SHUT_RDWR);
}

}  // namespace bps
