#include "transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "logging.h"

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
  reader.remaining_ = bytes;
  return reader;
}

const char* DataReader::View(size_t bytes) {
  if (!memory_ || bytes > remaining_) return nullptr;
  const char* view = memory_;
  memory_ += bytes;
  remaining_ -= bytes;
  return view;
}

Status DataReader::Read(void* dst, size_t bytes) {
  if (bytes > remaining_)
    return Status::Error("a frame's payload is shorter than its reader asked");
  remaining_ -= bytes;
  if (memory_) {
    if (bytes) std::memcpy(dst, memory_, bytes);
    memory_ += bytes;
    return Status::OK();
  }
  return stream_->ReceivePayload(dst, bytes);
}

Status DataReader::Skip() {
  const size_t rest = remaining_;
  remaining_ = 0;
  if (memory_ || rest == 0) return Status::OK();
  return stream_->DiscardPayload(rest);
}

// ---------------------------------------------------------------------------
// Channel

Status Channel::Send(const FrameHeader& header, const void* payload) {
  std::lock_guard<std::mutex> lock(write_mutex_);
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

SharedMemoryChannel::SharedMemoryChannel(std::unique_ptr<Connection> conn,
                                         std::shared_ptr<SharedSlots> slots, Side side)
    : Channel(std::move(conn)), slots_(std::move(slots)), side_(side) {}

Status SharedMemoryChannel::SendData(FrameHeader header, const void* data, const SlotKey& slot) {
  ShmLocation location;
  bool shared = header.length > 0 && slots_->table().Locate(data, header.length, &location);
  if (!shared && header.length > 0 && side_ == Side::kWorker) {
    char* staged = nullptr;
    Status status = slots_->Slot(slot, header.length, &staged, &location);
    if (!status.ok()) return status;
    std::memcpy(staged, data, header.length);
    shared = true;
  }
  if (!shared) return Send(header, data);  // An empty acknowledgement, say.
  std::lock_guard<std::mutex> lock(write_mutex_);
  // The peer must hold every arena up to the slot's before it reads the location.
  while (announced_ <= location.arena) {
    std::shared_ptr<SharedArena> arena = slots_->table().Get(announced_);
    const ArenaAnnouncement announcement{announced_, 0, arena->size()};
    FrameHeader frame;
    frame.type = static_cast<uint8_t>(FrameType::kArena);
    frame.length = sizeof(announcement);
    Status status = conn_->Send(frame, &announcement, arena->fd());
    if (!status.ok()) return status;
    ++announced_;
  }
  header.type = static_cast<uint8_t>(header.type == static_cast<uint8_t>(FrameType::kPush)
                                         ? FrameType::kPushShm
                                         : FrameType::kReplyShm);
  header.length = sizeof(location);
  return conn_->Send(header, &location);
}

Status SharedMemoryChannel::AddPeerArena(const FrameHeader& header, DataReader* payload) {
  const int fd = conn_->TakeReceivedFd();
  ArenaAnnouncement announcement;
  Status status = header.length == sizeof(announcement)
                      ? payload->Read(&announcement, sizeof(announcement))
                      : Status::Error("a malformed shared-memory announcement from " + peer());
  if (status.ok() && fd < 0)
    status = Status::Error(peer() + " announced shared memory without its descriptor");
  if (!status.ok()) {
    if (fd >= 0) ::close(fd);
    return status;
  }
  std::shared_ptr<SharedArena> arena;
  status = SharedArena::Map(fd, announcement.size, &arena);  // Owns fd.
  if (!status.ok()) return Status::Error(status.message() + " (announced by " + peer() + ")");
  if (side_ == Side::kServer) slots_->table().Add(arena);
  peer_arenas_.Add(announcement.index, std::move(arena));
  return Status::OK();
}

Status SharedMemoryChannel::Receive(FrameHeader* header, DataReader* payload, bool* eof) {
  while (true) {
    Status status = ReceiveFromSocket(header, payload, eof);
    if (!status.ok()) return status;
    const auto type = static_cast<FrameType>(header->type);
    if (type == FrameType::kArena) {
      status = AddPeerArena(*header, payload);
      if (!status.ok()) return status;
      continue;
    }
    if (type != FrameType::kPushShm && type != FrameType::kReplyShm) return Status::OK();
    ShmLocation location;
    if (header->length != sizeof(location))
      return Status::Error("a malformed shared-memory frame from " + peer());
    status = payload->Read(&location, sizeof(location));
    if (!status.ok()) return status;
    const char* data = peer_arenas_.Resolve(location);
    if (!data) return Status::Error(peer() + " pointed outside the shared memory it announced");
    header->type =
        static_cast<uint8_t>(type == FrameType::kPushShm ? FrameType::kPush : FrameType::kReply);
    header->length = location.length;
    *payload = DataReader::OfMemory(data, location.length);
    return Status::OK();
  }
}

// ---------------------------------------------------------------------------
// Connecting and listening

Status ConnectToServer(const ServerAddress& address, const std::string& peer, int timeout_ms,
                       std::unique_ptr<Channel>* out) {
  int fd = -1;
  if (address.same_host && ConnectLocal(address.port, timeout_ms, &fd).ok()) {
    BPS_LOG(kDebug) << peer << " is on this host: using its Unix socket and shared memory";
    *out = std::make_unique<SharedMemoryChannel>(
        std::make_unique<Connection>(fd, peer),
        std::make_shared<SharedSlots>(std::make_shared<ArenaTable>()),
        SharedMemoryChannel::Side::kWorker);
    return Status::OK();
  }
  Status status = ConnectTcp(address.host, address.port, timeout_ms, timeout_ms, &fd);
  if (!status.ok()) return status;
  *out = std::make_unique<SocketChannel>(std::make_unique<Connection>(fd, peer));
  return Status::OK();
}

Listener::Listener()
    : shared_results_(std::make_shared<SharedSlots>(std::make_shared<ArenaTable>())) {}

Listener::~Listener() {
  Close();
  for (int fd : {tcp_fd_, local_fd_})
    if (fd >= 0) ::close(fd);
}

Status Listener::Listen(int port, int send_timeout_ms, int* bound_port) {
  send_timeout_ms_ = send_timeout_ms;
  Status status = ListenTcp(port, &tcp_fd_, bound_port);
  if (!status.ok()) return status;
  status = ListenLocal(*bound_port, &local_fd_);
  if (!status.ok()) BPS_LOG(kWarning) << status.message() << "; local workers will use TCP";
  return Status::OK();
}

Status Listener::Accept(std::unique_ptr<Channel>* out) {
  pollfd listeners[2] = {{tcp_fd_, POLLIN, 0}, {local_fd_, POLLIN, 0}};
  const nfds_t count = local_fd_ >= 0 ? 2 : 1;
  while (true) {
    if (::poll(listeners, count, -1) < 0) {
      if (errno == EINTR) continue;
      return Status::Error(std::string("poll() on the listening sockets failed: ") +
                           std::strerror(errno));
    }
    for (nfds_t i = 0; i < count; ++i) {
      if (listeners[i].revents & (POLLERR | POLLHUP | POLLNVAL))
        return Status::Error(ErrorKind::kShutdown, "the listener is closed");
      if (!(listeners[i].revents & POLLIN)) continue;
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(listeners[i].fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ConfigureSocket(fd, send_timeout_ms_);
      if (addr.ss_family == AF_UNIX) {
        *out = std::make_unique<SharedMemoryChannel>(
            std::make_unique<Connection>(fd, "a worker on this host"), shared_results_,
            SharedMemoryChannel::Side::kServer);
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
      return Status::OK();
    }
  }
}

void Listener::Close() {
  for (int fd : {tcp_fd_, local_fd_})
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

}  // namespace bps
