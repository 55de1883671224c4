// A ZeroMQ DEALER socket on one TCP connection, speaking ZMTP 3.0 with the NULL
// security mechanism (rfc.zeromq.org/spec/23): just enough to talk to the scheduler's
// ROUTER socket (pyzmq, tf_bps/control/scheduler.py) without linking libzmq, so the native
// server needs nothing beyond libc to run on a bare server machine.
//
// Bytes from the peer are bounded before anything is allocated for them: a frame
// over kMaxFrameBytes, a malformed greeting or frame ends the connection with an error.
#ifndef TF_BPS_CONTROL_ZMQ_DEALER_H_
#define TF_BPS_CONTROL_ZMQ_DEALER_H_

#include <cstddef>
#include <memory>
#include <string>

#include "../common/common.h"

namespace bps {

class ZmqDealer {
 public:
  // Control messages are small JSON objects (the scheduler refuses more than 64 KiB).
  static constexpr size_t kMaxFrameBytes = 1 << 20;

  // Connects to host:port, retrying until `timeout_ms` passes (as ZeroMQ does while
  // the peer starts), then exchanges greetings.
  static Status Connect(const std::string& host, int port, int timeout_ms,
                        std::unique_ptr<ZmqDealer>* out);
  // The same over a connected socket `fd` (taken over: closed with the dealer, or at
  // once if the handshake fails), named
  // `peer` in messages: for a peer reached some other way (a socketpair in a test).
  static Status Adopt(int fd, const std::string& peer, int timeout_ms,
                      std::unique_ptr<ZmqDealer>* out);
  ~ZmqDealer();
  ZmqDealer(const ZmqDealer&) = delete;
  ZmqDealer& operator=(const ZmqDealer&) = delete;

  Status Send(const std::string& message);
  // The next one-frame message within `timeout_ms` (0: only what has arrived);
  // `received` is false when none came. Messages of several frames are not the
  // scheduler's and are skipped.
  Status Receive(int timeout_ms, std::string* message, bool* received);
  // Readable when bytes arrive: for a poll over several descriptors.
  int fd() const { return fd_; }

 private:
  ZmqDealer(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  Status Handshake(int timeout_ms);
  // Waits up to `timeout_ms` for bytes and appends what is there; false on timeout.
  Status Fill(int timeout_ms, bool* got);
  // Takes one whole frame off the buffer, if it holds one.
  Status TakeFrame(unsigned char* flags, std::string* body, bool* complete);
  Status SendFrame(unsigned char flags, const std::string& body);

  int fd_;
  std::string peer_;
  std::string buffer_;            // received, not yet parsed
  bool in_long_message_ = false;  // skipping the parts of a message of several frames
};

}  // namespace bps

#endif  // TF_BPS_CONTROL_ZMQ_DEALER_H_
