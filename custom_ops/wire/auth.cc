#include "auth.h"

#include <sys/random.h>

#include <cstring>
#include <vector>

namespace bps {
namespace {

constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t RotateRight(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void Compress(uint32_t state[8], const uint8_t block[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t{block[4 * i]} << 24 | uint32_t{block[4 * i + 1]} << 16 |
           uint32_t{block[4 * i + 2]} << 8 | block[4 * i + 3];
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = RotateRight(w[i - 15], 7) ^ RotateRight(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = RotateRight(w[i - 2], 17) ^ RotateRight(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3], e = state[4], f = state[5],
           g = state[6], h = state[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (RotateRight(e, 6) ^ RotateRight(e, 11) ^ RotateRight(e, 25)) +
                        ((e & f) ^ (~e & g)) + kRoundConstants[i] + w[i];
    const uint32_t t2 = (RotateRight(a, 2) ^ RotateRight(a, 13) ^ RotateRight(a, 22)) +
                        ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  const uint32_t add[8] = {a, b, c, d, e, f, g, h};
  for (int i = 0; i < 8; ++i) state[i] += add[i];
}

Status RandomNonce(Nonce* nonce) {
  if (::getrandom(nonce->data(), nonce->size(), 0) != static_cast<ssize_t>(nonce->size()))
    return Status::Error("no randomness for a handshake nonce");
  return Status::OK();
}

// What a side signs: who it is, the other side's nonce, and the worker's rank.
Digest Proof(const std::string& token, const char* side, const Nonce& nonce, uint32_t rank) {
  std::vector<uint8_t> message(side, side + std::strlen(side));
  message.insert(message.end(), nonce.begin(), nonce.end());
  for (int i = 0; i < 4; ++i) message.push_back(static_cast<uint8_t>(rank >> (8 * i)));
  return HmacSha256(token, message.data(), message.size());
}

bool SameDigest(const Digest& a, const Digest& b) {
  uint8_t difference = 0;  // Constant time: no early exit to time.
  for (size_t i = 0; i < a.size(); ++i) difference |= a[i] ^ b[i];
  return difference == 0;
}

// The next frame, which must be `type` with exactly `bytes` of payload into `out`.
Status Expect(Channel& channel, FrameType type, void* out, size_t bytes, FrameHeader* header) {
  DataReader payload;
  bool eof = false;
  Status status = channel.Receive(header, &payload, &eof);
  // Closed before a frame: the peer refused us (a server turning connections away).
  if (!status.ok()) return eof ? Status::Error(ErrorKind::kPeerGone, status.message()) : status;
  if (header->type != static_cast<uint8_t>(type) || header->length != bytes)
    return Status::Error("an unexpected frame in the handshake");
  return payload.Read(out, bytes);
}

struct HelloProof {
  Nonce nonce;
  Digest proof;
};
static_assert(sizeof(FrameHeader) + sizeof(HelloProof) == kHelloFrameBytes,
              "a hello is a header and its proof");

}  // namespace

Digest Sha256(const void* data, size_t bytes) {
  uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const auto* in = static_cast<const uint8_t*>(data);
  size_t full = bytes / 64 * 64;
  for (size_t at = 0; at < full; at += 64) Compress(state, in + at);
  // The tail, a 1 bit, zeros, and the length in bits: one or two more blocks.
  uint8_t tail[128] = {};
  const size_t rest = bytes - full;
  std::memcpy(tail, in + full, rest);
  tail[rest] = 0x80;
  const size_t tail_bytes = rest + 9 <= 64 ? 64 : 128;
  const uint64_t bits = static_cast<uint64_t>(bytes) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_bytes - 1 - i] = static_cast<uint8_t>(bits >> (8 * i));
  for (size_t at = 0; at < tail_bytes; at += 64) Compress(state, tail + at);
  Digest digest;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) digest[4 * i + j] = static_cast<uint8_t>(state[i] >> (24 - 8 * j));
  return digest;
}

Digest HmacSha256(const std::string& key, const void* data, size_t bytes) {
  uint8_t block[64] = {};
  if (key.size() > sizeof(block)) {
    const Digest hashed = Sha256(key.data(), key.size());
    std::memcpy(block, hashed.data(), hashed.size());
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  std::vector<uint8_t> inner(64 + bytes);
  for (int i = 0; i < 64; ++i) inner[i] = block[i] ^ 0x36;
  if (bytes) std::memcpy(inner.data() + 64, data, bytes);
  const Digest inner_digest = Sha256(inner.data(), inner.size());
  uint8_t outer[64 + 32];
  for (int i = 0; i < 64; ++i) outer[i] = block[i] ^ 0x5c;
  std::memcpy(outer + 64, inner_digest.data(), inner_digest.size());
  return Sha256(outer, sizeof(outer));
}

Status ChallengeWorker(Channel& channel, Nonce* challenge) {
  Status status = RandomNonce(challenge);
  FrameHeader header;
  header.type = static_cast<uint8_t>(FrameType::kChallenge);
  header.length = challenge->size();
  return status.ok() ? channel.Send(header, challenge->data()) : status;
}

Status WelcomeWorker(Channel& channel, const std::string& token, int num_workers,
                     const Nonce& challenge, uint32_t* rank) {
  FrameHeader hello;
  HelloProof theirs;
  Status status = Expect(channel, FrameType::kHello, &theirs, sizeof(theirs), &hello);
  if (!status.ok())
    return Status::Error("it did not introduce itself as a worker of this job (" +
                         status.message() + ")");
  if (hello.rank >= static_cast<uint32_t>(num_workers))
    return Status::Error("it claims rank " + std::to_string(hello.rank) + ", outside this job");
  if (!SameDigest(theirs.proof, Proof(token, "worker", challenge, hello.rank)))
    return Status::Error("it does not know this job's token (BYTEPS_JOB_TOKEN)");
  FrameHeader welcome;
  welcome.type = static_cast<uint8_t>(FrameType::kWelcome);
  welcome.rank = hello.rank;
  const Digest proof = Proof(token, "server", theirs.nonce, hello.rank);
  welcome.length = proof.size();
  status = channel.Send(welcome, proof.data());
  channel.SetReceiveTimeout(0);  // A worker may be silent for as long as it computes.
  *rank = hello.rank;
  return status;
}

Status AuthenticateWorker(Channel& channel, const std::string& token, int num_workers,
                          int timeout_ms, uint32_t* rank) {
  channel.SetReceiveTimeout(timeout_ms);
  Nonce challenge;
  Status status = ChallengeWorker(channel, &challenge);
  return status.ok() ? WelcomeWorker(channel, token, num_workers, challenge, rank) : status;
}

Status AuthenticateServer(Channel& channel, const std::string& token, uint32_t rank,
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
    hello.proof = Proof(token, "worker", theirs, rank);
    header = FrameHeader();
    header.type = static_cast<uint8_t>(FrameType::kHello);
    header.rank = rank;
    header.length = sizeof(hello);
    status = channel.Send(header, &hello);
  }
  Digest proof;
  if (status.ok())
    status = Expect(channel, FrameType::kWelcome, proof.data(), proof.size(), &header);
  if (!status.ok()) return Status::Error("the handshake failed: " + status.message());
  if (!SameDigest(proof, Proof(token, "server", hello.nonce, rank)))
    return Status::Error("it does not know this job's token (BYTEPS_JOB_TOKEN): not our server");
  channel.SetReceiveTimeout(0);
  return Status::OK();
}

}  // namespace bps
