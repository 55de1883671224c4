// A Prometheus endpoint (BYTEPS_METRICS_PORT): a minimal HTTP/1.0 server on a thread of
// its own. `GET /metrics` (and `GET /`) is answered with the text a callback renders, in
// Prometheus' text exposition format, and the connection is closed; any other request
// gets 404 or 405 and is closed too.
//
// Every byte it reads may come from a stranger, so it serves one connection at a time
// and bounds each: its request may be at most kMaxRequestBytes up to the blank line that
// ends the headers, and the request and the answer together must be done within
// kDeadlineMs of the accept, however slowly the bytes trickle. A client that breaks
// either bound loses its connection; none can hold the endpoint longer than the deadline,
// nor make it allocate more than the bound.
#ifndef TF_BPS_SERVER_METRICS_ENDPOINT_H_
#define TF_BPS_SERVER_METRICS_ENDPOINT_H_

#include <functional>
#include <string>
#include <thread>

#include "../common/common.h"

namespace bps {

class MetricsEndpoint {
 public:
  // Renders the exposition; called on the endpoint's thread, once per scrape.
  using Render = std::function<std::string()>;

  static constexpr size_t kMaxRequestBytes = 8 * 1024;
  static constexpr int kDeadlineMs = 2000;

  MetricsEndpoint() = default;
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Listens on `host` (an IPv4 address; empty: every interface) at `port` (0: any free
  // one), writes the bound port, and starts serving with `render`.
  Status Start(const std::string& host, int port, Render render, int* bound_port);
  // Ends the thread within one poll's wake-up, whatever a client is doing; idempotent.
  void Stop();

 private:
  void Loop();
  // Reads one request from `fd` (non-blocking) and answers it, all before `deadline_ms`
  // of the monotonic clock; returns early when Stop() is called.
  void Serve(int fd, int64_t deadline_ms);
  // Waits until `fd` is ready for `events` or Stop() is called or the deadline passes;
  // true only in the first case.
  bool WaitFor(int fd, short events, int64_t deadline_ms);
  // Writes all of `text` before the deadline; false if it could not.
  bool WriteAll(int fd, const std::string& text, int64_t deadline_ms);
  std::string Answer(const std::string& request);

  Render render_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};  // Stop() writes a byte: every poll here watches [0]
  std::thread thread_;
};

}  // namespace bps

#endif  // TF_BPS_SERVER_METRICS_ENDPOINT_H_
