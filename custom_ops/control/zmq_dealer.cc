#include "zmq_dealer.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "../common/logging.h"
#include "../wire/socket.h"

namespace bps {
namespace {

constexpr size_t kGreetingBytes = 64;
constexpr unsigned char kMore = 0x01, kLong = 0x02, kCommand = 0x04;

std::string Greeting() {
  std::string greeting(kGreetingBytes, '\0');
  greeting[0] = '\xff';  // signature: 0xff, 8 bytes of padding, 0x7f
  greeting[9] = '\x7f';
  greeting[10] = 3;  // version 3.0
  greeting[11] = 0;
  memcpy(&greeting[12], "NULL", 4);  // mechanism, zero-padded to 20 bytes
  greeting[32] = 0;                  // as-server: no
  return greeting;
}

// A command's body: its name, then properties (a name, a 4-byte length, a value).
std::string ReadyCommand() {
  std::string body = "\x05READY";
  const std::string name = "Socket-Type", value = "DEALER";
  body += static_cast<char>(name.size());
  body += name;
  for (int shift = 24; shift >= 0; shift -= 8)
    body += static_cast<char>((value.size() >> shift) & 0xff);
  return body + value;
}

std::string CommandName(const std::string& body) {
  if (body.empty() || size_t{static_cast<unsigned char>(body[0])} + 1 > body.size()) return "";
  return body.substr(1, static_cast<unsigned char>(body[0]));
}

int RemainingMs(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

}  // namespace

Status ZmqDealer::Connect(const std::string& host, int port, int timeout_ms,
                          std::unique_ptr<ZmqDealer>* out) {
  int fd = -1;
  Status status = ConnectTcp(host, port, timeout_ms, timeout_ms, &fd);
  if (!status.ok()) return status;
  return Adopt(fd, host + ":" + std::to_string(port), timeout_ms, out);
}

Status ZmqDealer::Adopt(int fd, const std::string& peer, int timeout_ms,
                        std::unique_ptr<ZmqDealer>* out) {
  std::unique_ptr<ZmqDealer> dealer(new ZmqDealer(fd, peer));
  Status status = dealer->Handshake(timeout_ms);
  if (!status.ok()) return status;
  *out = std::move(dealer);
  return Status::OK();
}

ZmqDealer::~ZmqDealer() { close(fd_); }

Status ZmqDealer::Handshake(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string greeting = Greeting();
  if (send(fd_, greeting.data(), greeting.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(greeting.size()))
    return Status::Error(ErrorKind::kPeerGone,
                         "cannot greet the scheduler at " + peer_ + ": " + strerror(errno));
  Status status = SendFrame(kCommand, ReadyCommand());
  if (!status.ok()) return status;
  while (buffer_.size() < kGreetingBytes) {
    bool got = false;
    status = Fill(RemainingMs(deadline), &got);
    if (!status.ok()) return status;
    if (!got)
      return Status::Error(ErrorKind::kTimeout, "the scheduler at " + peer_ +
                                                    " did not greet within " +
                                                    std::to_string(timeout_ms) + " ms");
  }
  const auto* peer = reinterpret_cast<const unsigned char*>(buffer_.data());
  if (peer[0] != 0xff || (peer[9] & 1) != 1 || peer[10] < 3 ||
      buffer_.compare(12, 5, std::string("NULL\0", 5)) != 0)
    return Status::Error(ErrorKind::kInternal,
                         "the peer at " + peer_ +
                             " does not speak ZeroMQ 3 without security: it is not a tf_bps "
                             "scheduler (check DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT)");
  buffer_.erase(0, kGreetingBytes);
  // The peer's READY command follows; Receive() skips commands.
  return Status::OK();
}

Status ZmqDealer::Fill(int timeout_ms, bool* got) {
  *got = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  pollfd ready{fd_, POLLIN, 0};
  int polled;
  while ((polled = poll(&ready, 1, RemainingMs(deadline))) < 0 && errno == EINTR) {
  }
  if (polled < 0)
    return Status::Error(ErrorKind::kInternal, std::string("poll: ") + strerror(errno));
  if (polled == 0) return Status::OK();
  char chunk[65536];
  ssize_t bytes = recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
  if (bytes == 0)
    return Status::Error(ErrorKind::kPeerGone,
                         "the scheduler at " + peer_ + " closed the connection");
  if (bytes < 0) {
    if (errno == EAGAIN || errno == EINTR) return Status::OK();
    return Status::Error(ErrorKind::kPeerGone,
                         "lost the scheduler at " + peer_ + ": " + strerror(errno));
  }
  buffer_.append(chunk, static_cast<size_t>(bytes));
  *got = true;
  return Status::OK();
}

Status ZmqDealer::TakeFrame(unsigned char* flags, std::string* body, bool* complete) {
  *complete = false;
  if (buffer_.empty()) return Status::OK();
  *flags = static_cast<unsigned char>(buffer_[0]);
  if (*flags & ~(kMore | kLong | kCommand))
    return Status::Error(ErrorKind::kInternal, "a malformed frame from the scheduler at " + peer_ +
                                                   " (flags " + std::to_string(*flags) + ")");
  size_t header = (*flags & kLong) ? 9 : 2;
  if (buffer_.size() < header) return Status::OK();
  uint64_t size = 0;
  for (size_t i = 1; i < header; ++i) size = (size << 8) | static_cast<unsigned char>(buffer_[i]);
  if (size > kMaxFrameBytes)
    return Status::Error(ErrorKind::kInternal, "the scheduler at " + peer_ + " sent a frame of " +
                                                   std::to_string(size) + " bytes, over the " +
                                                   std::to_string(kMaxFrameBytes) + " allowed");
  if (buffer_.size() < header + size) return Status::OK();
  body->assign(buffer_, header, size);
  buffer_.erase(0, header + size);
  *complete = true;
  return Status::OK();
}

Status ZmqDealer::Receive(int timeout_ms, std::string* message, bool* received) {
  *received = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  // A peer that keeps sending what is not a message (commands, parts of long ones)
  // must not hold the caller past its deadline; what is buffered is still read.
  for (bool first = true; first || RemainingMs(deadline) > 0; first = false) {
    unsigned char flags = 0;
    std::string body;
    bool complete = false;
    Status status = TakeFrame(&flags, &body, &complete);
    if (!status.ok()) return status;
    if (!complete) {
      bool got = false;
      status = Fill(RemainingMs(deadline), &got);
      if (!status.ok()) return status;
      if (!got) return Status::OK();  // Nothing more within the time.
      continue;
    }
    if (flags & kCommand) {
      if (CommandName(body) == "ERROR")
        return Status::Error(ErrorKind::kPeerGone,
                             "the scheduler at " + peer_ + " refused the connection");
      continue;  // READY and others carry nothing for us.
    }
    // The scheduler's messages are one frame each; longer ones are skipped whole.
    const bool last = !(flags & kMore);
    const bool whole = last && !in_long_message_;
    in_long_message_ = !last;
    if (!whole) {
      if (last) BPS_LOG(kWarning) << "dropped a message of several parts from " << peer_;
      continue;
    }
    message->swap(body);
    *received = true;
    return Status::OK();
  }
  return Status::OK();
}

Status ZmqDealer::SendFrame(unsigned char flags, const std::string& body) {
  std::string frame(1, '\0');
  if (body.size() > 255) {
    frame[0] = static_cast<char>(flags | kLong);
    for (int shift = 56; shift >= 0; shift -= 8)
      frame += static_cast<char>((static_cast<uint64_t>(body.size()) >> shift) & 0xff);
  } else {
    frame[0] = static_cast<char>(flags);
    frame += static_cast<char>(body.size());
  }
  frame += body;
  size_t sent = 0;
  while (sent < frame.size()) {
    ssize_t bytes = send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (bytes < 0 && errno == EINTR) continue;
    if (bytes <= 0)
      return Status::Error(ErrorKind::kPeerGone,
                           "cannot send to the scheduler at " + peer_ + ": " + strerror(errno));
    sent += static_cast<size_t>(bytes);
  }
  return Status::OK();
}

Status ZmqDealer::Send(const std::string& message) { return SendFrame(0, message); }

}  // namespace bps
