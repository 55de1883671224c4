// The endpoint's thread and why it cannot hang or deadlock:
//  - It blocks only in poll(), always with the stop pipe among the descriptors and, while
//    a client is served, with a timeout that ends at the client's deadline. Every socket
//    it reads or writes is non-blocking. So Stop() (one byte into the pipe, then join)
//    returns within one wake-up, and a client costs at most kDeadlineMs.
//  - It holds no lock of its own. The render callback runs with no socket in hand that
//    could wait on a client, and takes only the short leaf locks of what it reads
//    (server_metrics.h); nothing that holds those waits on this thread.
#include "metrics_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "../common/logging.h"

namespace bps {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Response(const std::string& status, const std::string& content_type,
                     const std::string& body, const std::string& extra_headers = "") {
  return "HTTP/1.0 " + status + "\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra_headers +
         "Connection: close\r\n\r\n" + body;
}

std::string PlainResponse(const std::string& status, const std::string& extra_headers = "") {
  return Response(status, "text/plain; charset=utf-8", status + "\n", extra_headers);
}

}  // namespace

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

Status MetricsEndpoint::Start(const std::string& host, int port, Render render,
                              int* bound_port) {
  if (listen_fd_ >= 0) return Status::Error("the metrics endpoint is already serving");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (!host.empty() && ::inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1)
    return Status::Error(host + " is not an IPv4 address");
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Error(std::string("socket() failed: ") + std::strerror(errno));
  // A port the last run of this server left in TIME_WAIT may be taken again at once.
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(fd, 16) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return Status::Error(error);
  }
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (::pipe2(stop_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    const std::string error = std::strerror(errno);
    ::close(fd);
    return Status::Error("pipe() failed: " + error);
  }
  *bound_port = ntohs(address.sin_port);
  listen_fd_ = fd;
  render_ = std::move(render);
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void MetricsEndpoint::Stop() {
  if (!thread_.joinable()) return;
  char byte = 1;
  // The pipe is never read: once written, every later poll sees it readable.
  if (::write(stop_pipe_[1], &byte, 1) < 0) BPS_LOG(kWarning) << "cannot stop the metrics thread";
  thread_.join();
  ::close(listen_fd_);
  listen_fd_ = -1;
  for (int& fd : stop_pipe_) {
    ::close(fd);
    fd = -1;
  }
}

void MetricsEndpoint::Loop() {
  while (true) {
    pollfd watched[2] = {{stop_pipe_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    if (::poll(watched, 2, -1) < 0) {
      if (errno == EINTR) continue;
      BPS_LOG(kError) << "the metrics endpoint stops: poll() failed: " << std::strerror(errno);
      return;
    }
    if (watched[0].revents != 0) return;
    if (watched[1].revents == 0) continue;
    // Non-blocking: a client that connected and left again leaves nothing to accept.
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors, say: the pending connection stays and the listener stays
      // readable, so wait a moment (or for Stop) rather than spin.
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        WaitFor(-1, 0, NowMs() + 100);
      continue;
    }
    Serve(fd, NowMs() + kDeadlineMs);
    ::close(fd);
  }
}

bool MetricsEndpoint::WaitFor(int fd, short events, int64_t deadline_ms) {
  while (true) {
    const int64_t left = deadline_ms - NowMs();
    if (left <= 0) return false;
    pollfd watched[2] = {{stop_pipe_[0], POLLIN, 0}, {fd, events, 0}};
    const int ready = ::poll(watched, fd >= 0 ? 2 : 1, static_cast<int>(left));
    if (ready < 0 && errno != EINTR) return false;
    if (watched[0].revents != 0) return false;  // Stop()
    if (ready > 0 && watched[1].revents != 0) return true;
  }
}

bool MetricsEndpoint::WriteAll(int fd, const std::string& text, int64_t deadline_ms) {
  size_t sent = 0;
  while (sent < text.size()) {
    const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(fd, POLLOUT, deadline_ms)) return false;
    } else {
      return false;  // The client went away.
    }
  }
  return true;
}

void MetricsEndpoint::Serve(int fd, int64_t deadline_ms) {
  // The request up to the blank line; what follows it (a body) is never read.
  std::string request;
  char chunk[1024];
  size_t end = std::string::npos;
  while (end == std::string::npos) {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n > 0) {
      // Look for the end only from where the new bytes could complete it.
      const size_t from = request.size() < 3 ? 0 : request.size() - 3;
      request.append(chunk, static_cast<size_t>(n));
      end = request.find("\r\n\r\n", from);
      if (end == std::string::npos) end = request.find("\n\n", from);
      if (end == std::string::npos && request.size() > kMaxRequestBytes) {
        WriteAll(fd, PlainResponse("431 Request Header Fields Too Large"), deadline_ms);
        return;
      }
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(fd, POLLIN, deadline_ms)) return;  // Too slow, or Stop().
    } else {
      return;  // Closed before the request ended, or broken.
    }
  }
  if (end > kMaxRequestBytes) {
    WriteAll(fd, PlainResponse("431 Request Header Fields Too Large"), deadline_ms);
    return;
  }
  request.resize(end);
  if (WriteAll(fd, Answer(request), deadline_ms)) ::shutdown(fd, SHUT_WR);
}

std::string MetricsEndpoint::Answer(const std::string& request) {
  // The request line: METHOD SP TARGET SP VERSION.
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  const size_t first_space = line.find(' ');
  const size_t second_space =
      first_space == std::string::npos ? std::string::npos : line.find(' ', first_space + 1);
  if (second_space == std::string::npos || line.compare(second_space + 1, 5, "HTTP/") != 0)
    return PlainResponse("400 Bad Request");
  const std::string method = line.substr(0, first_space);
  std::string path = line.substr(first_space + 1, second_space - first_space - 1);
  path = path.substr(0, path.find('?'));  // Prometheus may add parameters; none matter.
  if (path != "/metrics" && path != "/") return PlainResponse("404 Not Found");
  if (method != "GET") return PlainResponse("405 Method Not Allowed", "Allow: GET\r\n");
  return Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_());
}

}  // namespace bps
