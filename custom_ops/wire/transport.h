// Transports: how frames and tensor data travel between a worker and a server, and
// the one place where they plug in.
//
// Worker and server hold a Channel and never ask which transport made it. Every
// transport starts from a socket Connection (socket.h) on which both sides prove the
// job token (auth.h; a server's waiting room, waiting_room.h) before it makes a
// channel, so that a stranger never reaches a transport's memory. Each transport is a
// folder under wire/ and one line in transports.cc:
//   tcp/  every byte on a TCP socket
//   shm/  a Unix socket to a server on this host; tensor data lies in shared memory
//         and only its location crosses the socket
// ConnectToServer() tries the registered transports that reach a server, in their
// order there; a Listener listens on all of them. Frames keep their logical types
// whatever the transport (kPush, kReply); a transport's own frames on the wire (the
// shared-memory kPushShm, kReplyShm, kArena) never leave it.
#ifndef TF_BPS_WIRE_TRANSPORT_H_
#define TF_BPS_WIRE_TRANSPORT_H_

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../common/common.h"
#include "crypto.h"
#include "protocol.h"
#include "shared_memory.h"
#include "socket.h"

namespace bps {

// The payload of one received frame, read front to back. Valid until the next
// Receive() on its channel.
class DataReader {
 public:
  static DataReader OfStream(Connection* stream, size_t bytes);
  static DataReader OfMemory(const char* memory, size_t bytes);

  size_t remaining() const { return remaining_; }
  // The next `bytes` where they lie, if they lie in shared memory, where they stay
  // until the frame is answered; null on a socket, where Read() must copy them out
  // (a sealed payload too: it lies in a buffer the next frame reuses).
  const char* View(size_t bytes);
  Status Read(void* dst, size_t bytes);
  // Drops what is left unread, so that the stream stays in step.
  Status Skip();

 private:
  // A sealed stream's payload is read and checked whole before any byte of it is
  // used; then it is read from memory.
  Status OpenSealed();

  Connection* stream_ = nullptr;
  const char* memory_ = nullptr;
  bool lasting_ = false;  // memory_ outlives the next frame (shared memory)
  size_t remaining_ = 0;
  Status failure_ = Status::OK();
};

// One worker's link to one server (or to a peer worker): frames out, frames in.
class Channel {
 public:
  virtual ~Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Names the peer in errors.
  virtual const std::string& peer() const = 0;
  // A frame whose `header.length`-byte payload is sent as it is (declarations,
  // errors, control). Safe from several threads.
  virtual Status Send(const FrameHeader& header, const void* payload) = 0;
  // A push or a reply (`header.type` kPush or kReply) of `header.length` bytes of
  // tensor data. `slot` is where a transport that shares memory may stage the bytes.
  // Safe from several threads.
  virtual Status SendData(FrameHeader header, const void* data, const SlotKey& slot) = 0;
  // See SharedSlots::Retire; nothing where no memory is shared.
  virtual void RetireSlots(uint64_t tensor_id) = 0;
  // The peer left and nothing it sent is read any more: its memory is let go.
  virtual void ForgetPeerMemory() = 0;
  // The next frame for the caller and its payload. One thread receives.
  virtual Status Receive(FrameHeader* header, DataReader* payload, bool* eof) = 0;
  // True when data in shared memory (Listener::shared_results()) reaches this peer
  // without a copy.
  virtual bool shares_memory() const = 0;
  // Bound each wait in Receive or Send (0: none); a wait that runs out fails it.
  virtual void SetReceiveTimeout(int ms) = 0;
  virtual void SetSendTimeout(int ms) = 0;
  // Wakes a thread blocked in Receive; the channel stays allocated.
  virtual void Shutdown() = 0;
  // No more sends; the peer reads EOF after what was sent, and receiving still works.
  virtual void ShutdownWrite() = 0;

 protected:
  Channel() = default;
};

struct ServerAddress {
  std::string host;
  int port;
  // The server runs on this host and BYTEPS_ENABLE_IPC lets a transport of this
  // host (shm/) reach it.
  bool same_host = false;
};

// What a worker's connection to a server needs, whatever the transport.
struct ConnectRequest {
  ServerAddress address;
  std::string peer;  // names the server in errors
  JobSecret secret{""};
  uint32_t rank = 0;
  int timeout_ms = 0;
  Cancellation* cancel = nullptr;  // optional
  // Where pushes are staged (optional; shared with this process's other channels).
  std::shared_ptr<SharedSlots> slots;
  uint32_t generation = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // A required transport is one a server cannot serve without: it listens first and
  // fixes the port the address book names, and its failure to connect is the
  // worker's. Another listens beside it (named after that port, say); when it cannot,
  // or cannot connect, workers take the next transport.
  virtual bool required() const = 0;

  // A worker's side: whether it may carry the channel to `address`.
  virtual bool Reaches(const ServerAddress& address) const = 0;
  // Connects, proves the token both ways (ProveServer) and makes the channel.
  virtual Status Connect(const ConnectRequest& request, std::unique_ptr<Channel>* out) const = 0;

  // A server's side: listens on `host` (empty: every interface) and `*port` (a
  // required transport: 0 picks a free one, written back); `token` names what only
  // the job may find. `*fd` is the descriptor a poll waits on for connections.
  virtual Status Listen(const std::string& host, int* port, const std::string& token,
                        int* fd) const = 0;
  // A socket `fd` accepted from `address`: the peer's name and the source whose share
  // of the waiting room it takes, or why it is refused (then it is closed).
  virtual Status Admit(int fd, const sockaddr_storage& address, std::string* peer,
                       std::string* source) const = 0;
  // The channel of an accepted connection once it has proven the token; `results` is
  // where the server computes results (Listener::shared_results()).
  virtual std::unique_ptr<Channel> ServerChannel(
      std::unique_ptr<Connection> connection, std::shared_ptr<SharedSlots> results) const = 0;
};

// The registered transports, in the order a worker tries them (transports.cc).
const std::vector<const Transport*>& RegisteredTransports();

// A worker's side of the handshake on a fresh connection (AuthenticateServer), with
// the socket shut down if `request.cancel` fires meanwhile (then kAborted).
Status ProveServer(Connection& connection, const ConnectRequest& request);

// Connects to a server as worker `rank` and makes sure it is the job's (both prove
// `secret`'s token, see auth.h; frames are sealed if it says so), by the first
// registered transport that reaches it and connects, retrying until `timeout_ms`
// passes or `cancel` (optional) fires. `peer` names the server in errors. Pushes are
// staged in `slots` (optional; shared with this process's other channels: data
// already in one of their arenas goes as a location where the transport shares
// memory). The channel belongs to job generation `generation`: a server of another
// refuses the worker's hello.
Status ConnectToServer(const ServerAddress& address, const std::string& peer,
                       const JobSecret& secret, uint32_t rank, int timeout_ms,
                       std::unique_ptr<Channel>* out, Cancellation* cancel = nullptr,
                       std::shared_ptr<SharedSlots> slots = nullptr, uint32_t generation = 0);

// A server's listening side, on every registered transport; a connection gets its
// transport's channel once it has proven the token (a stranger never gets as far as a
// transport's memory).
class Listener {
 public:
  Listener();
  ~Listener();
  // On `host` (empty: every interface); port 0 picks a free one. `send_timeout_ms`
  // bounds every send on accepted connections; `token` names the job's endpoints.
  Status Listen(const std::string& host, int port, int send_timeout_ms, const std::string& token,
                int* bound_port);
  // Waits up to `timeout_ms` (-1: for ever) for the next connection, still bare:
  // kTimeout when none came; an error once Close() ran. `source`: whose share of the
  // waiting room it takes ("local" on this host); `door`: the transport it came by
  // (for ChannelOf).
  Status Accept(std::unique_ptr<Connection>* out, std::string* source, int* door,
                int timeout_ms = -1);
  // The channel of an accepted connection once it has proven the token.
  std::unique_ptr<Channel> ChannelOf(std::unique_ptr<Connection> connection, int door);
  // The listening descriptors, for a poll that waits on other sockets too (then
  // Accept(out, source, door, 0) takes what came).
  std::vector<int> fds() const;
  // Wakes Accept() for good.
  void Close();
  // The job generation of the connections accepted from now on (socket.h).
  void set_generation(uint32_t generation) { generation_ = generation; }
  // Where a server computes results that same-host workers read without a copy
  // over a socket; shared by every channel this listener accepts.
  SharedSlots& shared_results() { return *shared_results_; }

 private:
  struct Door {
    const Transport* transport;
    int fd;
  };
  // Says why a connection was closed at once, a few times per window.
  void WarnAtMostEvery10s(const std::string& text);

  std::vector<Door> doors_;
  int send_timeout_ms_ = 0;
  uint32_t generation_ = 0;
  std::chrono::steady_clock::time_point last_refusal_log_{};
  const std::shared_ptr<SharedSlots> shared_results_;
};

}  // namespace bps

#endif  // TF_BPS_WIRE_TRANSPORT_H_
