// Framed messages over TCP. A frame is a fixed header followed by `length` payload
// bytes. Payloads are written straight from the caller's memory (writev) and read
// straight into the caller's buffer, so tensor data is never staged in between.
#ifndef TF_BPS_CORE_TRANSPORT_H_
#define TF_BPS_CORE_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common.h"

namespace bps {

enum class FrameType : uint8_t {
  kHello = 1,    // worker -> server, first frame: `rank` identifies the worker.
  kDeclare = 2,  // worker -> server: payload describes a tensor (name, dtype, shape).
  kPush = 3,     // worker -> server: one partition's data for summation.
  kReply = 4,    // server -> worker: the summed partition.
  kError = 5,    // server -> worker: payload is a message; the partition failed.
  kBye = 6,      // worker -> server: clean shutdown, no more pushes from this rank.
  // Same-host peers (Unix socket) only:
  kArena = 7,      // either way: a shared-memory arena; payload ArenaAnnouncement, fd attached.
  kPushShm = 8,    // like kPush, but the data lies in the worker's arena (payload ShmLocation).
  kReplyShm = 9,   // like kReply, but the sum lies in the server's arena (payload ShmLocation).
};

struct ArenaAnnouncement {
  uint32_t index = 0;
  uint32_t reserved = 0;
  uint64_t size = 0;
};

constexpr uint32_t kFrameMagic = 0x31535042;  // "BPS1"

// Fixed-size header; both ends are the same build on little-endian hosts.
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t type = 0;
  uint8_t dtype = 0;
  uint16_t reserved = 0;
  uint32_t rank = 0;       // sending worker's rank (worker -> server frames).
  uint32_t part = 0;       // partition index within the tensor.
  uint64_t tensor_id = 0;  // stable hash of the tensor's name.
  uint64_t signature = 0;  // hash of dtype and shape; equal across workers or an error.
  uint64_t length = 0;     // payload bytes that follow.
};
static_assert(sizeof(FrameHeader) == 40, "frame header layout is part of the wire format");

// One TCP connection. Reads and writes may happen on different threads; writes
// from several threads must hold `write_mutex()`.
class Connection {
 public:
  Connection(int fd, std::string peer);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const std::string& peer() const { return peer_; }
  std::mutex& write_mutex() { return write_mutex_; }

  // `fd` >= 0 is passed to the peer with the frame (Unix sockets only).
  Status Send(const FrameHeader& header, const void* payload, int fd = -1);
  // Returns an error on EOF or failure; `eof` tells a clean close apart.
  Status ReceiveHeader(FrameHeader* header, bool* eof);
  // The descriptor that came with the last header, or -1; the caller owns it.
  int TakeReceivedFd();
  Status ReceivePayload(void* dst, size_t bytes);
  Status DiscardPayload(size_t bytes);
  // Wakes a thread blocked in Receive*; the connection stays allocated.
  void Shutdown();

 private:
  int fd_;
  int received_fd_ = -1;
  std::string peer_;
  std::mutex write_mutex_;
};

// Connects to host:port, retrying until `timeout_ms` passes.
Status ConnectTcp(const std::string& host, int port, int timeout_ms, int send_timeout_ms,
                  int* fd_out);

// Listens on all interfaces; port 0 picks a free one. Writes the bound port.
Status ListenTcp(int port, int* fd_out, int* bound_port);

// Peers on the same host skip TCP/IP: the server also listens on a Unix socket in
// the abstract namespace, named after its TCP port (unique per network namespace).
Status ListenLocal(int tcp_port, int* fd_out);
Status ConnectLocal(int tcp_port, int send_timeout_ms, int* fd_out);

// Tunes an accepted or connected socket for small-message latency.
void ConfigureSocket(int fd, int send_timeout_ms);

// A tensor's description, the payload of a kDeclare frame.
struct Declaration {
  std::string name;
  DataType dtype;
  std::vector<int64_t> shape;
};
std::string EncodeDeclaration(const Declaration& declaration);
bool DecodeDeclaration(const std::string& payload, Declaration* declaration);
// Equal signatures mean equal dtype and shape.
uint64_t TensorSignature(DataType dtype, const std::vector<int64_t>& shape);

// 64-bit FNV-1a: stable across processes and builds, used for tensor ids.
uint64_t StableHash(const void* data, size_t bytes, uint64_t seed = 1469598103934665603ULL);

}  // namespace bps

#endif  // TF_BPS_CORE_TRANSPORT_H_
