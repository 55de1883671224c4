// The socket layer under the transports (transport.h): framed messages over TCP or a
// Unix socket. A frame is a FrameHeader (protocol.h) followed by `length` payload
// bytes. Payloads are written straight from the caller's memory (sendmsg) and read
// straight into the caller's buffer, so tensor data is never staged in between.
#ifndef TF_BPS_WIRE_SOCKET_H_
#define TF_BPS_WIRE_SOCKET_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../common/common.h"
#include "crypto.h"
#include "protocol.h"

namespace bps {

// One socket connection. Reads and writes may happen on different threads; writes
// from several threads must hold `write_mutex()`. Once sealed (BYTEPS_ENCRYPT), every
// frame travels as crypto.h describes, and ReceivePayload/DiscardPayload give way to
// OpenPayload.
class Connection {
 public:
  Connection(int fd, std::string peer);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const std::string& peer() const { return peer_; }
  // For a poll over many connections.
  int fd() const { return fd_; }
  // Bytes that arrived and wait to be read; 0 also once the peer closed (a poll
  // then says readable), -1 on error.
  int BytesArrived() const;
  std::mutex& write_mutex() { return write_mutex_; }
  // The job generation of this connection (FrameHeader::generation): stamped on every
  // frame sent; a frame received with another fails ReceiveHeader. Set it before
  // the first frame either way.
  void set_generation(uint32_t generation) { generation_ = generation; }
  uint32_t generation() const { return generation_; }

  // From now on frames are sealed on their way out and opened on their way in. Set
  // right after the handshake, before either side sends again.
  void Seal(std::unique_ptr<RecordCipher> sealer, std::unique_ptr<RecordCipher> opener);
  bool sealed() const { return opener_ != nullptr; }

  // `fd` >= 0 is passed to the peer with the frame (Unix sockets only).
  Status Send(const FrameHeader& header, const void* payload, int fd = -1);
  // Returns an error on EOF or failure; `eof` tells a clean close apart.
  Status ReceiveHeader(FrameHeader* header, bool* eof);
  // The descriptor that came with the last header, or -1; the caller owns it.
  int TakeReceivedFd();
  Status ReceivePayload(void* dst, size_t bytes);
  Status DiscardPayload(size_t bytes);
  // Sealed: reads the payload of the last header (`bytes` long) whole, checks and
  // decrypts it; `plain` stays valid until the next frame is received.
  Status OpenPayload(size_t bytes, const char** plain);
  void SetReceiveTimeout(int ms);
  void SetSendTimeout(int ms);
  // Wakes a thread blocked in Receive*; the connection stays allocated.
  void Shutdown();
  // No more writes; the peer reads EOF after what was sent, and reads still work.
  void ShutdownWrite();

 private:
  // Writes every byte of `parts`, `fd` riding on the first (see Send).
  Status WriteAll(iovec* parts, int count, int fd);
  Status SendSealed(const FrameHeader& stamped, const void* payload, int fd);
  Status ReceiveBytes(char* dst, size_t bytes, bool* eof);

  int fd_;
  int received_fd_ = -1;
  uint32_t generation_ = 0;
  std::string peer_;
  std::mutex write_mutex_;
  std::unique_ptr<RecordCipher> sealer_;  // guarded by the writers' lock
  std::unique_ptr<RecordCipher> opener_;  // used by the receiving thread
  std::vector<char> sealed_out_;          // a piece of payload being sealed
  std::vector<char> opened_in_;           // the last payload opened
};

// Lets another thread stop connections being set up (a job's abort while a worker
// is still starting): retries end, and watched sockets are shut down, waking any wait.
class Cancellation {
 public:
  void Cancel(const std::string& reason);
  // Whether it was cancelled, and why.
  bool cancelled(std::string* reason = nullptr) const;
  // False (and nothing watched) once cancelled.
  bool Watch(int fd);
  void Unwatch(int fd);

 private:
  mutable std::mutex mutex_;
  bool cancelled_ = false;
  std::string reason_;
  std::vector<int> watched_;
};

// Connects to host:port, retrying until `timeout_ms` passes or `cancel` is cancelled.
Status ConnectTcp(const std::string& host, int port, int timeout_ms, int send_timeout_ms,
                  int* fd_out, const Cancellation* cancel = nullptr);

// Listens on `host` (an IPv4 address; empty: every interface); port 0 picks a free
// one. Writes the bound port.
Status ListenTcp(const std::string& host, int port, int* fd_out, int* bound_port);

// Peers on the same host skip TCP/IP: Unix sockets in the abstract namespace (names
// are unique per network namespace, and nothing is left on disk). Any process of the
// host may bind an abstract name or connect to one, so names are derived from the job
// token (nobody without it can take one first), and both ends check who runs the
// other (CheckLocalPeer). A server's is named after the token and its TCP port.
std::string ServerSocketName(const std::string& token, int tcp_port);
Status ListenLocal(const std::string& name, int* fd_out);
// Connects and checks that the listener runs as a trusted uid (CheckLocalPeer).
Status ConnectLocal(const std::string& name, int send_timeout_ms, int* fd_out);

// Who may talk to this process over a local socket: its own uid, and the uids set
// here (BYTEPS_LOCAL_UIDS), once at start-up.
void SetTrustedLocalUids(std::vector<uint32_t> uids);
// OK when the process at the other end of Unix socket `fd` runs as a trusted uid
// (SO_PEERCRED); otherwise why not.
Status CheckLocalPeer(int fd);

// Tunes an accepted or connected socket for small-message latency.
void ConfigureSocket(int fd, int send_timeout_ms);

}  // namespace bps

#endif  // TF_BPS_WIRE_SOCKET_H_
