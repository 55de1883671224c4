// Transports: how frames and tensor data travel between a worker and a server.
//
//   SocketChannel        every byte on the socket (TCP, or a Unix socket).
//   SharedMemoryChannel  a Unix socket to a peer on this host; tensor data lies in
//                        shared memory and only its location crosses the socket.
//
// Worker and server use the same Channel interface and never ask which one they
// have: ConnectToServer() and Listener pick it by where the peer runs. Frames keep
// their logical types on both (kPush, kReply); the shared-memory variants on the
// wire (kPushShm, kReplyShm, kArena) never leave this layer.
#ifndef TF_BPS_WIRE_TRANSPORT_H_
#define TF_BPS_WIRE_TRANSPORT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../common/common.h"
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

class Channel {
 public:
  virtual ~Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  const std::string& peer() const { return conn_->peer(); }
  // For a poll over many channels (a server's waiting room): see Connection.
  int fd() const { return conn_->fd(); }
  int BytesArrived() const { return conn_->BytesArrived(); }
  // A frame whose `header.length`-byte payload is sent as it is (declarations,
  // errors, control). Safe from several threads.
  Status Send(const FrameHeader& header, const void* payload);
  // A push or a reply (`header.type` kPush or kReply) of `header.length` bytes of
  // tensor data. `slot` is where a shared-memory transport may stage the bytes.
  // Safe from several threads.
  virtual Status SendData(FrameHeader header, const void* data, const SlotKey& slot) = 0;
  // See SharedSlots::Retire.
  virtual void RetireSlots(uint64_t /*tensor_id*/) {}
  // The peer left and nothing it sent is read any more: its memory is let go.
  virtual void ForgetPeerMemory() {}
  // The next frame for the caller and its payload. One thread receives.
  virtual Status Receive(FrameHeader* header, DataReader* payload, bool* eof) = 0;
  // True when data in shared memory (Listener::shared_results()) reaches this peer
  // without a copy.
  virtual bool shares_memory() const { return false; }
  // Bound each wait in Receive or Send (0: none); a wait that runs out fails it.
  void SetReceiveTimeout(int ms) { conn_->SetReceiveTimeout(ms); }
  void SetSendTimeout(int ms) { conn_->SetSendTimeout(ms); }
  // Wakes a thread blocked in Receive; the channel stays allocated.
  void Shutdown() { conn_->Shutdown(); }
  // No more sends; the peer reads EOF after what was sent, and receiving still works.
  void ShutdownWrite() { conn_->ShutdownWrite(); }
  // Seals every frame from now on (see Connection::Seal; auth.h does it).
  void Seal(std::unique_ptr<RecordCipher> sealer, std::unique_ptr<RecordCipher> opener) {
    std::lock_guard<std::mutex> lock(write_mutex_);
    conn_->Seal(std::move(sealer), std::move(opener));
  }

 protected:
  explicit Channel(std::unique_ptr<Connection> conn) : conn_(std::move(conn)) {}
  // Reads a header and hands the payload to a stream reader.
  Status ReceiveFromSocket(FrameHeader* header, DataReader* payload, bool* eof);

  // Control frames a transport sends before the caller's (write_mutex_ held).
  virtual void SendControlLocked() {}

  std::unique_ptr<Connection> conn_;
  std::mutex write_mutex_;
};

class SocketChannel : public Channel {
 public:
  explicit SocketChannel(std::unique_ptr<Connection> conn) : Channel(std::move(conn)) {}
  Status SendData(FrameHeader header, const void* data, const SlotKey& slot) override;
  Status Receive(FrameHeader* header, DataReader* payload, bool* eof) override;
};

class SharedMemoryChannel : public Channel {
 public:
  enum class Side {
    // Pushes not already in `slots` are copied into their partition's slot.
    kWorker,
    // Results in `slots` go as a location, anything else over the socket.
    kServer,
  };
  SharedMemoryChannel(std::unique_ptr<Connection> conn, std::shared_ptr<SharedSlots> slots,
                      Side side);
  ~SharedMemoryChannel() override;
  Status SendData(FrameHeader header, const void* data, const SlotKey& slot) override;
  Status Receive(FrameHeader* header, DataReader* payload, bool* eof) override;
  void RetireSlots(uint64_t tensor_id) override { slots_->Retire(tensor_id); }
  void ForgetPeerMemory() override { peer_arenas_.Clear(); }
  bool shares_memory() const override { return true; }

 protected:
  void SendControlLocked() override;

 private:
  // Maps an arena the peer announced (its descriptor came with the frame).
  Status AddPeerArena(const FrameHeader& header, DataReader* payload);
  // The location of `data` for the peer, in a slot held for it; false to send the
  // bytes themselves.
  bool Locate(const FrameHeader& header, const void* data, const SlotKey& slot,
              ShmLocation* location, Status* status);
  // Keeps `location` held until the peer is done with it (see below).
  void HoldForPeer(const FrameHeader& header, const ShmLocation& location);
  // Bookkeeping of a frame the peer sent: an answer lets go of its push; a fence is
  // acknowledged, an acknowledgement lets go of the replies it covers.
  void OnPeerFrame(const FrameHeader& header);

  const std::shared_ptr<SharedSlots> slots_;
  const Side side_;
  uint32_t announced_ = 0;  // Arenas of `slots_`' table the peer knows; guarded by write_mutex_.
  PeerArenas peer_arenas_;

  // What the peer was handed and may still read. A pushed location is read until
  // the push's round is answered (a reply or an error, exactly one per push). A
  // replied location is read by the peer's receiving thread before it takes the next
  // frame, so a fence sent after it and acknowledged proves it read; replies wait
  // for the next fence. One fence is out at a time; a receiving thread never sends
  // (a send can block on a peer that waits for it to read), so an acknowledgement
  // and a fence that is due go out before the next frame this side sends.
  std::mutex held_mutex_;
  std::unordered_map<PartitionKey, std::vector<std::pair<uint32_t, ShmLocation>>,
                     PartitionKeyHash>
      held_pushes_;                                            // by partition: (round, location)
  std::deque<std::pair<uint64_t, ShmLocation>> held_replies_;  // (covering fence, location)
  uint64_t fences_sent_ = 0;
  uint64_t fences_acknowledged_ = 0;
  bool fence_due_ = false;        // a reply waits for the next fence
  uint64_t acknowledgement_ = 0;  // the peer's latest fence, to acknowledge; 0: none
};

struct ServerAddress {
  std::string host;
  int port;
  bool same_host = false;  // Try the server's local Unix socket before TCP.
};

// Connects to a server as worker `rank` and makes sure it is the job's (both prove
// `secret`'s token, see auth.h; frames are sealed if it says so): through its Unix
// socket and shared memory when it runs on this host, else (or if that fails) over TCP, retrying
// until `timeout_ms` passes or `cancel` (optional) fires. `peer` names the server in errors. Pushes
// are staged in `slots` (optional; shared with this process's other channels, data already in one
// of their arenas goes as a location). The channel belongs to job generation
// `generation`: a server of another refuses the worker's hello.
Status ConnectToServer(const ServerAddress& address, const std::string& peer,
                       const JobSecret& secret, uint32_t rank, int timeout_ms,
                       std::unique_ptr<Channel>* out, Cancellation* cancel = nullptr,
                       std::shared_ptr<SharedSlots> slots = nullptr, uint32_t generation = 0);

// A server's listening side: TCP, and a Unix socket (named after the job token and the
// TCP port) for workers on this host, which get shared-memory channels once they have
// proven the token (a stranger never gets as far as shared memory).
class Listener {
 public:
  Listener();
  ~Listener();
  // On `host` (empty: every interface); port 0 picks a free one. `send_timeout_ms`
  // bounds every send on accepted connections; `token` names the local socket.
  Status Listen(const std::string& host, int port, int send_timeout_ms, const std::string& token,
                int* bound_port);
  // Waits up to `timeout_ms` (-1: for ever) for the next connection, still bare:
  // kTimeout when none came; an error once Close() ran. `local`: it came through the
  // Unix socket, from a process of a trusted uid (others are closed at once).
  Status Accept(std::unique_ptr<Connection>* out, bool* local, int timeout_ms = -1);
  // The channel of an accepted connection once it has proven the token.
  std::unique_ptr<Channel> ChannelOf(std::unique_ptr<Connection> connection, bool local);
  // The listening descriptors, for a poll that waits on other sockets too (then
  // Accept(out, local, 0) takes what came).
  std::vector<int> fds() const;
  // Wakes Accept() for good.
  void Close();
  // The job generation of the connections accepted from now on (socket.h).
  void set_generation(uint32_t generation) { generation_ = generation; }
  // Where a server computes results that same-host workers read without a copy
  // over a socket; shared by every channel this listener accepts.
  SharedSlots& shared_results() { return *shared_results_; }

 private:
  // Says why a connection was closed at once, a few times per window.
  void WarnAtMostEvery10s(const std::string& text);

  int tcp_fd_ = -1;
  int local_fd_ = -1;
  int send_timeout_ms_ = 0;
  uint32_t generation_ = 0;
  std::chrono::steady_clock::time_point last_refusal_log_{};
  const std::shared_ptr<SharedSlots> shared_results_;
};

}  // namespace bps

#endif  // TF_BPS_WIRE_TRANSPORT_H_
