#include "auth.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "../common/logging.h"

namespace bps {
namespace {

using Clock = std::chrono::steady_clock;

// What a side signs: who it is, the other side's nonce, the worker's rank, and
// whether frames will be sealed (so that nobody in between can turn that off).
Digest Proof(const JobSecret& secret, const char* side, const Nonce& nonce, uint32_t rank,
             bool sealed) {
  std::vector<uint8_t> message(side, side + std::strlen(side));
  message.insert(message.end(), nonce.begin(), nonce.end());
  for (int i = 0; i < 4; ++i) message.push_back(static_cast<uint8_t>(rank >> (8 * i)));
  message.push_back(sealed ? 1 : 0);
  return HmacSha256(secret.token, message.data(), message.size());
}

uint8_t SealingFlag(const JobSecret& secret) { return secret.encrypt ? kFlagSealed : 0; }

// The most of a refusal's reason that a worker reads during its handshake.
constexpr uint64_t kMaxRefusalBytes = 1024;

// Exactly `bytes` before `deadline`, however the peer paces them. recv(), not
// recvmsg(): a descriptor a peer attaches before the proof is closed by the kernel,
// never taken.
Status ReadBy(Connection& connection, void* out, size_t bytes, Clock::time_point deadline,
              bool* eof) {
  char* into = static_cast<char*>(out);
  size_t got = 0;
  while (got < bytes) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd readable{connection.fd(), POLLIN, 0};
    const int ready = left.count() > 0 ? ::poll(&readable, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return Status::Error(ErrorKind::kTimeout, "the handshake's time ran out");
    const ssize_t n = ::recv(connection.fd(), into + got, bytes - got, MSG_DONTWAIT);
    if (n == 0) {
      *eof = true;
      return Status::Error(ErrorKind::kPeerGone, connection.peer() + " closed the connection");
    }
    if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
      return Status::Error(ErrorKind::kPeerGone, "the connection to " + connection.peer() +
                                                     " failed: " + std::strerror(errno));
    if (n > 0) got += static_cast<size_t>(n);
  }
  return Status::OK();
}

// The header's fixed fields: ours, of this connection's job generation.
bool IsOurs(const FrameHeader& header, uint32_t generation) {
  return header.magic == kFrameMagic && header.generation == generation;
}

// The worker's side: the next frame, which must be `type` with exactly `bytes` of
// payload into `out`; a kError instead is the server's refusal, with its reason.
Status Expect(Connection& connection, FrameType type, void* out, size_t bytes,
              Clock::time_point deadline, FrameHeader* header) {
  bool eof = false;
  Status status = ReadBy(connection, header, sizeof(*header), deadline, &eof);
  if (!status.ok()) return status;
  if (!IsOurs(*header, connection.generation()))
    return Status::Error("a frame that is not of this job's protocol and generation");
  if (header->type == static_cast<uint8_t>(FrameType::kError) &&
      header->length <= kMaxRefusalBytes) {
    std::string reason(header->length, '\0');
    status = ReadBy(connection, reason.data(), reason.size(), deadline, &eof);
    return status.ok() ? Status::Error(ErrorKind::kInvalidArgument, "refused: " + Printable(reason))
                       : status;
  }
  if (header->type != static_cast<uint8_t>(type) || header->length != bytes)
    return Status::Error("an unexpected frame in the handshake");
  return ReadBy(connection, out, bytes, deadline, &eof);
}

// From here on, `connection` seals what it sends and opens what it receives.
Status SealConnection(Connection& connection, const JobSecret& secret, const Nonce& server_nonce,
                      const Nonce& worker_nonce, uint32_t rank, bool server_side) {
  if (!secret.encrypt) return Status::OK();
  ConnectionKeys keys;
  Status status = DeriveConnectionKeys(secret.token, server_nonce, worker_nonce, rank, &keys);
  std::unique_ptr<RecordCipher> sealer, opener;
  if (status.ok())
    status = RecordCipher::Create(server_side ? keys.server_to_worker : keys.worker_to_server,
                                  RecordCipher::Role::kSeal, &sealer);
  if (status.ok())
    status = RecordCipher::Create(server_side ? keys.worker_to_server : keys.server_to_worker,
                                  RecordCipher::Role::kOpen, &opener);
  if (status.ok()) connection.Seal(std::move(sealer), std::move(opener));
  return status;
}

struct HelloProof {
  Nonce nonce;
  Digest proof;
};
static_assert(sizeof(FrameHeader) + sizeof(HelloProof) == kHelloFrameBytes,
              "a hello is a header and its proof");

struct Hello {
  FrameHeader header;
  HelloProof proof;
};
static_assert(sizeof(Hello) == kHelloFrameBytes, "a hello is read in one piece");

// Tells a worker that proved the token why it is refused.
void Refuse(Connection& connection, const std::string& reason) {
  FrameHeader refusal;
  refusal.type = static_cast<uint8_t>(FrameType::kError);
  refusal.length = reason.size();
  (void)connection.Send(refusal, reason.data());
}

}  // namespace

Status ChallengeWorker(Connection& connection, Nonce* challenge) {
  Status status = RandomNonce(challenge);
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kChallenge);
  header.length = challenge->size();
  return status.ok() ? connection.Send(header, challenge->data()) : status;
}

Status WelcomeWorker(Connection& connection, const JobSecret& secret, int num_workers,
                     const Nonce& challenge, uint32_t* rank) {
  // All of it has arrived (or the peer closed): one read that never waits, and never
  // more than a hello, whatever the header claims.
  Hello hello;
  const ssize_t got = ::recv(connection.fd(), &hello, sizeof(hello), MSG_DONTWAIT);
  const FrameHeader& header = hello.header;
  if (got != static_cast<ssize_t>(sizeof(hello)) || header.magic != kFrameMagic ||
      header.type != static_cast<uint8_t>(FrameType::kHello) ||
      header.length != sizeof(HelloProof))
    return Status::Error("it did not introduce itself as a worker of this job");
  // The proof first: until it checks, the peer learns nothing of the job.
  const bool sealed = (header.flags & kFlagSealed) != 0;
  if (!SameDigest(hello.proof.proof, Proof(secret, "worker", challenge, header.rank, sealed)))
    return Status::Error("it does not know this job's token (BYTEPS_JOB_TOKEN)");
  if (header.generation != connection.generation())
    return Status::Error("worker " + std::to_string(header.rank) + " belongs to job generation " +
                         std::to_string(header.generation) + ", this server to " +
                         std::to_string(connection.generation()));
  if (sealed != secret.encrypt) {
    // Said to the worker too, which otherwise could only guess why it was refused.
    const std::string reason =
        "worker " + std::to_string(header.rank) +
        (secret.encrypt ? " sends its frames in the clear and this server seals them"
                        : " seals its frames and this server sends them in the clear") +
        " (BYTEPS_ENCRYPT): start every node of the job with the same setting";
    Refuse(connection, reason);
    return Status::Error(reason);
  }
  if (header.rank >= static_cast<uint32_t>(num_workers))
    return Status::Error("it claims rank " + std::to_string(header.rank) + ", outside this job");
  FrameHeader welcome;
  welcome.type = static_cast<uint8_t>(FrameType::kWelcome);
  welcome.flags = SealingFlag(secret);
  welcome.rank = header.rank;
  const Digest proof = Proof(secret, "server", hello.proof.nonce, header.rank, secret.encrypt);
  welcome.length = proof.size();
  Status status = connection.Send(welcome, proof.data());
  if (status.ok())
    status = SealConnection(connection, secret, challenge, hello.proof.nonce, header.rank, true);
  *rank = header.rank;
  return status;
}

Status AuthenticateWorker(Connection& connection, const JobSecret& secret, int num_workers,
                          int timeout_ms, uint32_t* rank) {
  Nonce challenge;
  Status status = ChallengeWorker(connection, &challenge);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (status.ok()) {
    const int arrived = connection.BytesArrived();
    pollfd readable{connection.fd(), POLLIN, 0};
    if (arrived >= static_cast<int>(kHelloFrameBytes) ||
        (arrived == 0 && ::poll(&readable, 1, 0) == 1))  // the whole hello, or a close
      return WelcomeWorker(connection, secret, num_workers, challenge, rank);
    if (Clock::now() >= deadline)
      return Status::Error(ErrorKind::kTimeout, "it did not introduce itself in time");
    ::poll(&readable, 1, 10);
  }
  return status;
}

Status AuthenticateServer(Connection& connection, const JobSecret& secret, uint32_t rank,
                          int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  FrameHeader header;
  Nonce theirs;
  Status status = Expect(connection, FrameType::kChallenge, theirs.data(), theirs.size(), deadline,
                         &header);
  if (status.kind() == ErrorKind::kPeerGone)
    return Status::Error(ErrorKind::kPeerGone,
                         "it closed the connection before its challenge: " + status.message());
  HelloProof hello;
  if (status.ok()) status = RandomNonce(&hello.nonce);
  if (status.ok()) {
    hello.proof = Proof(secret, "worker", theirs, rank, secret.encrypt);
    header = FrameHeader();
    header.type = static_cast<uint8_t>(FrameType::kHello);
    header.flags = SealingFlag(secret);
    header.rank = rank;
    header.length = sizeof(hello);
    status = connection.Send(header, &hello);
  }
  Digest proof;
  if (status.ok())
    status = Expect(connection, FrameType::kWelcome, proof.data(), proof.size(), deadline, &header);
  if (!status.ok()) {  // A refusal is the user's to mend; anything else, a broken peer.
    const ErrorKind kind = status.kind() == ErrorKind::kInvalidArgument
                               ? ErrorKind::kInvalidArgument
                               : ErrorKind::kInternal;
    return Status::Error(kind, "the handshake failed: " + status.message());
  }
  if (!SameDigest(proof, Proof(secret, "server", hello.nonce, rank, secret.encrypt)))
    return Status::Error("it does not know this job's token (BYTEPS_JOB_TOKEN): not our server");
  return SealConnection(connection, secret, theirs, hello.nonce, rank, false);
}

}  // namespace bps
