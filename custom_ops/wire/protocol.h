// The wire format between workers and servers, in one place: frame kinds, the
// fixed frame header (operation kind and round in every frame), the shared-memory
// payloads and the tensor declaration a server uses to check and describe pushes.
#ifndef TF_BPS_WIRE_PROTOCOL_H_
#define TF_BPS_WIRE_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/common.h"

namespace bps {

// The workers of one host speak the same frames among themselves (local_merge.h): a
// partition's leader plays the server's part for kDeclare, kPush, kReply, kError and
// kAbandon, and kJoin and kBye tell the host's other workers that this one joined or left.
enum class FrameType : uint8_t {
  // The handshake (wire/auth.h): kChallenge, kHello, kWelcome, before anything else.
  kHello = 1,    // worker -> server: `rank` identifies the worker; payload its proof.
  kDeclare = 2,  // worker -> server: payload is a Declaration of the tensor.
  kPush = 3,     // worker -> server: one partition's data for this round.
  kReply = 4,    // server -> worker: the round's result for one partition.
  kError = 5,    // server -> worker: the round failed; payload is the message.
  // worker -> server: clean shutdown, no more pushes from this rank. server -> worker:
  // the server is stopping; payload why.
  kBye = 6,
  // Same-host peers (Unix socket) only:
  kArena = 7,     // either way: a shared-memory arena; payload ArenaAnnouncement, fd attached.
  kPushShm = 8,   // like kPush, but the data lies in the worker's arena (payload ShmLocation).
  kReplyShm = 9,  // like kReply, but the result lies in the server's arena (ShmLocation).
  kAbandon = 10,  // worker -> server: this worker gave up the round (its op failed).
  // worker -> server: process set `process_set` has the payload's ranks (int32 each,
  // ascending); an empty payload removes it. Every worker registers every set.
  kProcessSet = 11,
  // worker -> server: this worker has no more data (bps.join); rounds stop waiting for
  // it. server -> worker, once every worker joined: payload the last rank to join
  // (int32), then (tensor id uint64, last round uint32) pairs for workers to catch up.
  kJoin = 12,
  kJoined = 13,
  kChallenge = 14,  // server -> worker, on connecting: payload the server's nonce.
  kWelcome = 15,    // server -> worker: payload the server's proof.
  // Same-host peers, either way: the receiver has read every location sent before
  // fence number `tensor_id` once it acknowledges it (shm/shared_memory_channel.h).
  kFence = 16,
  kFenceAck = 17,
  // Between the workers of one host (device_merge.h): an operation is ready for a phase
  // of the device merge; local index 0's answer, numbered.
  kMergeReady = 18,
  kMergeGo = 19,
  // server -> worker: a round waits for some workers longer than the stall check time;
  // payload the warning, naming the tensor and the ranks missing (round_engine.h).
  kStall = 20,
};

// What a server does with a round's contributions: one per row of op_kinds.def, which
// says what each does. Wire values.
enum class OpKind : uint8_t {
#define BPS_OP_KIND(name, c_name, value, text, worker_policy, server_policy) k##name = value,
#include "op_kinds.def"
#undef BPS_OP_KIND
};

const char* OpKindName(OpKind kind);
bool IsValidOpKind(uint8_t value);

constexpr uint32_t kFrameMagic = 0x33535042;  // "BPS3"

// Fixed-size header; both ends are the same build on little-endian hosts.
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t type = 0;
  uint8_t op_kind = 0;
  uint8_t dtype = 0;
  uint8_t error_kind = 0;  // kError frames: an ErrorKind.
  uint32_t rank = 0;       // sending worker's rank (worker -> server frames).
  uint32_t part = 0;       // partition index within the tensor.
  // Each worker numbers its operations on one tensor 1, 2, 3, ...; a server never
  // mixes contributions of different rounds, and replies carry the round they end.
  uint32_t round = 0;
  uint8_t reduce_op = 0;  // push_pull, reducescatter: how the server combines (a ReduceOp).
  uint8_t flags = 0;      // FrameFlags
  // Between the workers of one host (local_merge.h): how many joins the sender has
  // seen complete, so that a contribution made after a join is never taken as
  // one made before it.
  uint16_t join_epoch = 0;
  // The one rank that receives this partition's result (alltoall, reducescatter); the
  // others get an empty acknowledgement. -1: every worker receives it.
  int32_t owner = -1;
  uint32_t process_set = 0;  // the workers taking part; 0: all of them
  uint64_t tensor_id = 0;    // stable hash of the tensor's name.
  uint64_t signature = 0;    // hash of everything workers must agree on; see Signature().
  // Allgather pushes: the sender's first dimension (its row count). Compressed
  // push_pull pushes: the partition's element count.
  int64_t rows = 0;
  uint64_t length = 0;  // payload bytes that follow.
  // The job generation the sender belongs to: the scheduler starts a new one each
  // time the job re-forms (a worker lost or gained). Stamped by the connection
  // (socket.h), which refuses a frame of another, so nothing of an older membership
  // reaches a newer one's rounds.
  uint32_t generation = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(FrameHeader) == 72, "frame header layout is part of the wire format");

enum FrameFlags : uint8_t {
  // A push_pull push that sums every worker of the sender's host (local_merge.h):
  // the server counts it for all of them.
  kFlagHostMerged = 1,
  // A hello or a welcome (auth.h): the sender seals every frame after the handshake.
  kFlagSealed = 2,
};

struct ArenaAnnouncement {
  uint32_t index = 0;
  uint32_t reserved = 0;
  uint64_t size = 0;
};

// Where a partition's bytes lie in the sender's arenas (payload of kPushShm/kReplyShm).
struct ShmLocation {
  uint32_t arena = 0;
  uint32_t reserved = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A tensor operation as one worker describes it (payload of kDeclare): what the
// server checks across workers and quotes when they disagree.
struct Declaration {
  std::string name;
  OpKind kind = OpKind::kPushPull;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root_rank = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  uint32_t process_set = 0;
  // kCompressedPushPull: the compressor's canonical text (FormatCompressorSpec); an
  // adapter's push_pull request may carry any spelling, "" for none.
  std::string compression;
};

std::string EncodeDeclaration(const Declaration& declaration);
bool DecodeDeclaration(const std::string& payload, Declaration* declaration);
// Equal signatures mean the workers agree on the operation: kind, dtype, shape (an
// allgather's first dimension may differ), reduce op, root, scale factors and
// compressor.
uint64_t Signature(const Declaration& declaration);
// For error messages: "allreduce(sum) of float32[2,3]", "broadcast from rank 1 of ...".
std::string Describe(const Declaration& declaration);
// "tensor 'g' does not match across workers: rank 0 sent ..., rank 1 sent ...".
std::string MismatchText(const Declaration& a, uint32_t rank_a, const Declaration& b,
                         uint32_t rank_b);

// Gathers (allgather, alltoall) take two steps under one round. Partition 0 exchanges
// sizes: an allgather's push is empty and carries its row count in `rows`; an
// alltoall's push is its splits (one int64 per receiving rank). Partitions 1.. then
// carry the rows: an allgather's cut by their place in the concatenated result, so
// that each reply lands in the output directly; an alltoall's one per receiving rank
// (partition 1 + r, owned by rank r). Every gather reply starts with every worker's
// `rows` (int64 each).
constexpr uint32_t kSizesPart = 0;

inline bool IsGather(OpKind kind) {
  return kind == OpKind::kAllgather || kind == OpKind::kAlltoall;
}
inline bool IsReduction(OpKind kind) {
  return kind == OpKind::kPushPull || kind == OpKind::kReduceScatter ||
         kind == OpKind::kCompressedPushPull;
}
// A push_pull, compressed or not: a host's workers merge these (local_merge.h).
inline bool IsPushPull(OpKind kind) {
  return kind == OpKind::kPushPull || kind == OpKind::kCompressedPushPull;
}
// Bytes of the tensor a declaration describes; UINT64_MAX when it overflows.
uint64_t DeclaredBytes(const Declaration& d);

inline size_t AllgatherTableBytes(int num_workers) {
  return static_cast<size_t>(num_workers) * sizeof(int64_t);
}

// 64-bit FNV-1a: stable across processes and builds, used for tensor ids.
uint64_t StableHash(const void* data, size_t bytes, uint64_t seed = 1469598103934665603ULL);

}  // namespace bps

#endif  // TF_BPS_WIRE_PROTOCOL_H_
