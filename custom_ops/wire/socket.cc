#include "socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace bps {
namespace {

std::string ErrnoText() { return std::strerror(errno); }

}  // namespace

Connection::Connection(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}

Connection::~Connection() {
  if (received_fd_ >= 0) ::close(received_fd_);
  ::close(fd_);
}

int Connection::TakeReceivedFd() {
  int fd = received_fd_;
  received_fd_ = -1;
  return fd;
}

namespace {

// Once one record fails, every later one does too (the count is lost): the
// connection is of no more use.
std::string NotAuthentic(const std::string& what, const std::string& peer) {
  return what + " from " + peer +
         " does not authenticate: it was tampered with, replayed or reordered on its way "
         "(BYTEPS_ENCRYPT)";
}

}  // namespace

void Connection::Seal(std::unique_ptr<RecordCipher> sealer, std::unique_ptr<RecordCipher> opener) {
  sealer_ = std::move(sealer);
  opener_ = std::move(opener);
}

Status Connection::Send(const FrameHeader& header, const void* payload, int fd) {
  FrameHeader stamped = header;
  stamped.generation = generation_;
  if (sealer_) return SendSealed(stamped, payload, fd);
  iovec parts[2];
  parts[0].iov_base = &stamped;
  parts[0].iov_len = sizeof(stamped);
  parts[1].iov_base = const_cast<void*>(payload);
  parts[1].iov_len = payload ? header.length : 0;
  return WriteAll(parts, parts[1].iov_len ? 2 : 1, fd);
}

// Sealed in pieces, each sent as soon as it is sealed, so that a large payload needs
// no staging buffer of its size; a small frame is still a single sendmsg.
Status Connection::SendSealed(const FrameHeader& stamped, const void* payload, int fd) {
  constexpr size_t kPieceBytes = 256 << 10;
  RecordCipher::Tag header_tag, payload_tag;
  Status status = sealer_->TagClear(&stamped, sizeof(stamped), &header_tag);
  const size_t length = payload ? stamped.length : 0;
  if (status.ok() && length) status = sealer_->Begin();
  const char* in = static_cast<const char*>(payload);
  size_t done = 0;
  for (bool first = true; status.ok() && (first || done < length); first = false) {
    const size_t piece = std::min(length - done, kPieceBytes);
    if (sealed_out_.size() < piece) sealed_out_.resize(piece);
    if (piece) status = sealer_->Encrypt(in + done, sealed_out_.data(), piece);
    const bool last = length && done + piece == length;
    if (status.ok() && last) status = sealer_->Finish(&payload_tag);
    if (!status.ok()) break;
    iovec parts[4];
    int count = 0;
    if (first) {
      parts[count++] = {const_cast<FrameHeader*>(&stamped), sizeof(stamped)};
      parts[count++] = {header_tag.data(), header_tag.size()};
    }
    if (piece) parts[count++] = {sealed_out_.data(), piece};
    if (last) parts[count++] = {payload_tag.data(), payload_tag.size()};
    status = WriteAll(parts, count, first ? fd : -1);
    done += piece;
  }
  return status;
}

Status Connection::WriteAll(iovec* parts, int count, int fd) {
  iovec* next = parts;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  while (count > 0) {
    msghdr message{};
    message.msg_iov = next;
    message.msg_iovlen = static_cast<size_t>(count);
    if (fd >= 0) {  // The descriptor rides on the first bytes sent, once.
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      cmsghdr* cmsg = CMSG_FIRSTHDR(&message);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    }
    ssize_t sent = ::sendmsg(fd_, &message, MSG_NOSIGNAL);
    if (sent > 0) fd = -1;
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return Status::Error("sending to " + peer_ + " timed out (peer stopped reading)");
      return Status::Error("sending to " + peer_ + " failed: " + ErrnoText());
    }
    size_t remaining = static_cast<size_t>(sent);
    while (count > 0 && remaining >= next->iov_len) {
      remaining -= next->iov_len;
      ++next;
      --count;
    }
    if (count > 0) {
      next->iov_base = static_cast<char*>(next->iov_base) + remaining;
      next->iov_len -= remaining;
    }
  }
  return Status::OK();
}

// The first `bytes` of a frame, taking a descriptor that comes with them.
Status Connection::ReceiveBytes(char* dst, size_t bytes, bool* eof) {
  size_t got = 0;
  while (got < bytes) {
    iovec part{dst + got, bytes - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd_, &message, MSG_CMSG_CLOEXEC);
    for (cmsghdr* cmsg = CMSG_FIRSTHDR(&message); n > 0 && cmsg;
         cmsg = CMSG_NXTHDR(&message, cmsg)) {
      if (cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS) {
        if (received_fd_ >= 0) ::close(received_fd_);
        std::memcpy(&received_fd_, CMSG_DATA(cmsg), sizeof(int));
      }
    }
    if (n == 0) {
      *eof = true;
      return Status::Error(peer_ + " closed the connection");
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      *eof = true;
      return Status::Error("connection to " + peer_ + " failed: " + ErrnoText());
    }
    got += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status Connection::ReceiveHeader(FrameHeader* header, bool* eof) {
  *eof = false;
  char start[sizeof(FrameHeader) + RecordCipher::kTagBytes];
  Status status = ReceiveBytes(start, opener_ ? sizeof(start) : sizeof(*header), eof);
  if (!status.ok()) return status;
  std::memcpy(header, start, sizeof(*header));
  if (opener_) {
    RecordCipher::Tag tag;
    std::memcpy(tag.data(), start + sizeof(*header), tag.size());
    if (!opener_->CheckClear(header, sizeof(*header), tag))
      return Status::Error(NotAuthentic("a frame", peer_));
  }
  if (header->magic != kFrameMagic)
    return Status::Error("garbled frame from " + peer_ +
                         " (is it a tf_bps peer of the same version?)");
  if (header->generation != generation_)
    return Status::Error(ErrorKind::kAborted, peer_ + " sent a frame of job generation " +
                                                  std::to_string(header->generation) +
                                                  " to a connection of generation " +
                                                  std::to_string(generation_) +
                                                  ": the job has re-formed since");
  return Status::OK();
}

Status Connection::OpenPayload(size_t bytes, const char** plain) {
  RecordCipher::Tag tag;
  if (opened_in_.size() < bytes) opened_in_.resize(bytes);
  Status status = ReceivePayload(opened_in_.data(), bytes);
  if (status.ok()) status = ReceivePayload(tag.data(), tag.size());
  if (!status.ok()) return status;
  if (!opener_->Open(opened_in_.data(), bytes, tag))
    return Status::Error(NotAuthentic("a frame's payload", peer_));
  *plain = opened_in_.data();
  return Status::OK();
}

Status Connection::ReceivePayload(void* dst, size_t bytes) {
  char* out = static_cast<char*>(dst);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::recv(fd_, out + got, bytes - got, MSG_WAITALL);
    if (n == 0) return Status::Error(peer_ + " closed the connection in the middle of a frame");
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Error("receiving from " + peer_ + " failed: " + ErrnoText());
    }
    got += static_cast<size_t>(n);
  }
  return Status::OK();
}

Status Connection::DiscardPayload(size_t bytes) {
  std::vector<char> sink(std::min<size_t>(bytes, 1 << 20));
  while (bytes > 0) {
    size_t chunk = std::min(bytes, sink.size());
    Status status = ReceivePayload(sink.data(), chunk);
    if (!status.ok()) return status;
    bytes -= chunk;
  }
  return Status::OK();
}

int Connection::BytesArrived() const {
  int bytes = 0;
  return ::ioctl(fd_, FIONREAD, &bytes) == 0 ? bytes : -1;
}

void Connection::SetReceiveTimeout(int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

void Connection::SetSendTimeout(int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void Connection::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

void Connection::ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }

void ConfigureSocket(int fd, int send_timeout_ms) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
               sizeof(one));  // Fails harmlessly on Unix sockets.
  if (send_timeout_ms > 0) {
    timeval tv{send_timeout_ms / 1000, (send_timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
}

void Cancellation::Cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cancelled_) return;
  cancelled_ = true;
  reason_ = reason;
  for (int fd : watched_) ::shutdown(fd, SHUT_RDWR);
}

bool Cancellation::cancelled(std::string* reason) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reason) *reason = reason_;
  return cancelled_;
}

bool Cancellation::Watch(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!cancelled_) watched_.push_back(fd);
  return !cancelled_;
}

void Cancellation::Unwatch(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_.erase(std::remove(watched_.begin(), watched_.end(), fd), watched_.end());
}

Status ConnectTcp(const std::string& host, int port, int timeout_ms, int send_timeout_ms,
                  int* fd_out, const Cancellation* cancel) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string port_text = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found);
  if (rc != 0 || !found) return Status::Error("cannot resolve " + host + ": " + ::gai_strerror(rc));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string last_error;
  while (true) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      ::freeaddrinfo(found);
      return Status::Error("socket() failed: " + ErrnoText());
    }
    if (::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      ::freeaddrinfo(found);
      ConfigureSocket(fd, send_timeout_ms);
      *fd_out = fd;
      return Status::OK();
    }
    last_error = ErrnoText();
    ::close(fd);
    std::string why;
    if (cancel && cancel->cancelled(&why)) {
      ::freeaddrinfo(found);
      return Status::Error(ErrorKind::kAborted, why);
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::freeaddrinfo(found);
  return Status::Error("cannot connect to " + host + ":" + port_text + " within " +
                       std::to_string(timeout_ms / 1000) + " s: " + last_error);
}

Status ListenTcp(const std::string& host, int port, int* fd_out, int* bound_port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!host.empty() && ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return Status::Error("cannot listen on " + host + ": not an IPv4 address");
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::Error("socket() failed: " + ErrnoText());
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0) {
    std::string error = ErrnoText();
    ::close(fd);
    return Status::Error("cannot listen on port " + std::to_string(port) + ": " + error);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound_port = ntohs(addr.sin_port);
  *fd_out = fd;
  return Status::OK();
}

namespace {

// Abstract names are at most 107 bytes; longer ones are cut (callers keep them short).
socklen_t LocalAddress(const std::string& name, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  // sun_path[0] stays '\0': the abstract namespace, nothing on disk to clean up.
  const size_t length = std::min(name.size(), sizeof(addr->sun_path) - 1);
  std::memcpy(addr->sun_path + 1, name.data(), length);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length);
}

}  // namespace

std::string ServerSocketName(const std::string& token, int tcp_port) {
  static const char kDigits[] = "0123456789abcdef";
  const std::string purpose = "server socket|" + std::to_string(tcp_port);
  const Digest digest = HmacSha256(token, purpose.data(), purpose.size());
  std::string name = "tf_bps-";
  for (size_t i = 0; i < 16; ++i) name += {kDigits[digest[i] >> 4], kDigits[digest[i] & 15]};
  return name;
}

namespace {

std::mutex trusted_uids_mutex;
std::vector<uint32_t> trusted_uids;

}  // namespace

void SetTrustedLocalUids(std::vector<uint32_t> uids) {
  std::lock_guard<std::mutex> lock(trusted_uids_mutex);
  trusted_uids = std::move(uids);
}

Status CheckLocalPeer(int fd) {
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0)
    return Status::Error("cannot tell who is at the other end of a local socket: " + ErrnoText());
  if (peer.uid == ::geteuid()) return Status::OK();
  std::lock_guard<std::mutex> lock(trusted_uids_mutex);
  if (std::find(trusted_uids.begin(), trusted_uids.end(), peer.uid) != trusted_uids.end())
    return Status::OK();
  return Status::Error("pid " + std::to_string(peer.pid) + " at the other end of a local socket "
                       "runs as uid " + std::to_string(peer.uid) + ", not as this process's uid " +
                       std::to_string(::geteuid()) + " or one of BYTEPS_LOCAL_UIDS");
}

Status ListenLocal(const std::string& name, int* fd_out) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error("socket(AF_UNIX) failed: " + ErrnoText());
  sockaddr_un addr;
  const socklen_t length = LocalAddress(name, &addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), length) != 0 || ::listen(fd, 128) != 0) {
    std::string error = ErrnoText();
    ::close(fd);
    return Status::Error("cannot listen on the local socket '" + name + "': " + error);
  }
  *fd_out = fd;
  return Status::OK();
}

Status ConnectLocal(const std::string& name, int send_timeout_ms, int* fd_out) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error("socket(AF_UNIX) failed: " + ErrnoText());
  sockaddr_un addr;
  const socklen_t length = LocalAddress(name, &addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), length) != 0) {
    std::string error = ErrnoText();
    ::close(fd);
    return Status::Error(ErrorKind::kPeerGone, "no local socket '" + name + "': " + error);
  }
  Status trusted = CheckLocalPeer(fd);
  if (!trusted.ok()) {
    ::close(fd);
    return trusted;
  }
  ConfigureSocket(fd, send_timeout_ms);
  *fd_out = fd;
  return Status::OK();
}

}  // namespace bps
