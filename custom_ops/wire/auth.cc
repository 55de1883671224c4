#include "auth.h"

#include <cstring>
#include <vector>

namespace bps {
namespace {

// What a side signs: who it is, the other side's nonce, the worker's rank, and
// whether frames will be sealed (so that nobody in between can turn that off).
Digest Proof(const JobSecret& secret, const char* side, const Nonce& nonce, uint32_t rank) {
  std::vector<uint8_t> message(side, side + std::strlen(side));
  message.insert(message.end(), nonce.begin(), nonce.end());
  for (int i = 0; i < 4; ++i) message.push_back(static_cast<uint8_t>(rank >> (8 * i)));
  message.push_back(secret.encrypt ? 1 : 0);
  return HmacSha256(secret.token, message.data(), message.size());
}

uint8_t SealingFlag(const JobSecret& secret) { return secret.encrypt ? kFlagSealed : 0; }

// The most of a refusal's reason that a worker reads during its handshake.
constexpr uint64_t kMaxRefusalBytes = 1024;

// The next frame, which must be `type` with exactly `bytes` of payload into `out`; a
// kError instead is the peer's refusal, with its reason.
Status Expect(Channel& channel, FrameType type, void* out, size_t bytes, FrameHeader* header) {
  DataReader payload;
  bool eof = false;
  Status status = channel.Receive(header, &payload, &eof);
  // Closed before a frame: the peer refused us (a server turning connections away).
  if (!status.ok()) return eof ? Status::Error(ErrorKind::kPeerGone, status.message()) : status;
  if (header->type == static_cast<uint8_t>(FrameType::kError) &&
      header->length <= kMaxRefusalBytes) {
    std::string reason(header->length, '\0');
    status = payload.Read(reason.data(), reason.size());
    return status.ok() ? Status::Error(ErrorKind::kInvalidArgument, "refused: " + reason) : status;
  }
  if (header->type != static_cast<uint8_t>(type) || header->length != bytes)
    return Status::Error("an unexpected frame in the handshake");
  return payload.Read(out, bytes);
}

// From here on, `channel` seals what it sends and opens what it receives.
Status SealChannel(Channel& channel, const JobSecret& secret, const Nonce& server_nonce,
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
  if (status.ok()) channel.Seal(std::move(sealer), std::move(opener));
  return status;
}

struct HelloProof {
  Nonce nonce;
  Digest proof;
};
static_assert(sizeof(FrameHeader) + sizeof(HelloProof) == kHelloFrameBytes,
              "a hello is a header and its proof");

}  // namespace

Status ChallengeWorker(Channel& channel, Nonce* challenge) {
  Status status = RandomNonce(challenge);
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kChallenge);
  header.length = challenge->size();
  return status.ok() ? channel.Send(header, challenge->data()) : status;
}

Status WelcomeWorker(Channel& channel, const JobSecret& secret, int num_workers,
                     const Nonce& challenge, uint32_t* rank) {
  FrameHeader hello;
  HelloProof theirs;
  Status status = Expect(channel, FrameType::kHello, &theirs, sizeof(theirs), &hello);
  if (!status.ok())
    return Status::Error("it did not introduce itself as a worker of this job (" +
                         status.message() + ")");
  if (hello.rank >= static_cast<uint32_t>(num_workers))
    return Status::Error("it claims rank " + std::to_string(hello.rank) + ", outside this job");
  if ((hello.flags & kFlagSealed) != SealingFlag(secret)) {
    // Said to the worker too, which otherwise could only guess why it was refused.
    const std::string reason =
        "worker " + std::to_string(hello.rank) +
        (secret.encrypt ? " sends its frames in the clear and this server seals them"
                        : " seals its frames and this server sends them in the clear") +
        " (BYTEPS_ENCRYPT): start every node of the job with the same setting";
    FrameHeader refusal;
    refusal.type = static_cast<uint8_t>(FrameType::kError);
    refusal.length = reason.size();
    (void)channel.Send(refusal, reason.data());
    return Status::Error(reason);
  }
  if (!SameDigest(theirs.proof, Proof(secret, "worker", challenge, hello.rank)))
    return Status::Error("it does not know this job's token (BYTEPS_JOB_TOKEN)");
  FrameHeader welcome;
  welcome.type = static_cast<uint8_t>(FrameType::kWelcome);
  welcome.flags = SealingFlag(secret);
  welcome.rank = hello.rank;
  const Digest proof = Proof(secret, "server", theirs.nonce, hello.rank);
  welcome.length = proof.size();
  status = channel.Send(welcome, proof.data());
  if (status.ok()) status = SealChannel(channel, secret, challenge, theirs.nonce, hello.rank, true);
  channel.SetReceiveTimeout(0);  // A worker may be silent for as long as it computes.
  *rank = hello.rank;
  return status;
}

Status AuthenticateWorker(Channel& channel, const JobSecret& secret, int num_workers,
                          int timeout_ms, uint32_t* rank) {
  channel.SetReceiveTimeout(timeout_ms);
  Nonce challenge;
  Status status = ChallengeWorker(channel, &challenge);
  return status.ok() ? WelcomeWorker(channel, secret, num_workers, challenge, rank) : status;
}

Status AuthenticateServer(Channel& channel, const JobSecret& secret, uint32_t rank,
                          int timeout_ms) {
  channel.SetReceiveTimeout(timeout_ms);
  FrameHeader header;
  Nonce theirs;
  Status status = Expect(channel, FrameType::kChallenge, theirs.data(), theirs.size(), &header);
  if (status.kind() == ErrorKind::kPeerGone)
    return Status::Error(ErrorKind::kPeerGone,
                         "it closed the connection before its challenge: " + status.message());
  HelloProof hello;
  if (status.ok()) status = RandomNonce(&hello.nonce);
  if (status.ok()) {
    hello.proof = Proof(secret, "worker", theirs, rank);
    header = FrameHeader();
    header.type = static_cast<uint8_t>(FrameType::kHello);
    header.flags = SealingFlag(secret);
    header.rank = rank;
    header.length = sizeof(hello);
    status = channel.Send(header, &hello);
  }
  Digest proof;
  if (status.ok())
    status = Expect(channel, FrameType::kWelcome, proof.data(), proof.size(), &header);
  if (!status.ok()) {  // A refusal is the user's to mend; anything else, a broken peer.
    const ErrorKind kind = status.kind() == ErrorKind::kInvalidArgument
                               ? ErrorKind::kInvalidArgument
                               : ErrorKind::kInternal;
    return Status::Error(kind, "the handshake failed: " + status.message());
  }
  if (!SameDigest(proof, Proof(secret, "server", hello.nonce, rank)))
    return Status::Error("it does not know this job's token (BYTEPS_JOB_TOKEN): not our server");
  channel.SetReceiveTimeout(0);
  return SealChannel(channel, secret, theirs, hello.nonce, rank, false);
}

}  // namespace bps
