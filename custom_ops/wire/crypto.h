// The cryptography of the wire, all of it from OpenSSL's libcrypto (linked statically,
// its symbols hidden): the hashes behind the job-token proofs (auth.h), the keys a
// connection derives from the token and both handshake nonces, and the sealing of
// frames with BYTEPS_ENCRYPT.
//
// A sealed frame is two AES-256-GCM records, each under a nonce that counts the
// records of its direction (never sent: a frame replayed, dropped or moved elsewhere
// in the stream is opened under the wrong count and fails):
//   header record   the 72-byte FrameHeader in the clear, then a 16-byte tag that
//                   authenticates it, so its length is trusted before anything is
//                   read or allocated for the payload;
//   payload record  (only when `length` > 0) the payload encrypted, then its tag.
// Headers say which tensor, partition and round a frame belongs to and how long it
// is, as TLS record lengths do; the tensor data itself is never in the clear.
#ifndef TF_BPS_WIRE_CRYPTO_H_
#define TF_BPS_WIRE_CRYPTO_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "../common/common.h"

namespace bps {

// What the job's nodes share: its token, and whether their frames are sealed.
struct JobSecret {
  // A token alone: frames in the clear, as most jobs run. Implicit on purpose: a
  // token is a secret without encryption.
  JobSecret(std::string token, bool encrypt = false)  // NOLINT(runtime/explicit)
      : token(std::move(token)), encrypt(encrypt) {}
  JobSecret(const char* token) : JobSecret(std::string(token)) {}  // NOLINT(runtime/explicit)
  std::string token;
  bool encrypt = false;
};

using Digest = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 16>;

Digest Sha256(const void* data, size_t bytes);
Digest HmacSha256(const std::string& key, const void* data, size_t bytes);
// Constant time: no early exit for a peer to time.
bool SameDigest(const Digest& a, const Digest& b);
Status RandomNonce(Nonce* nonce);

using SealKey = std::array<uint8_t, 32>;

// The two keys of one connection (HKDF-SHA256 over the token, salted with the
// server's and the worker's nonces), one per direction.
struct ConnectionKeys {
  SealKey worker_to_server;
  SealKey server_to_worker;
};
Status DeriveConnectionKeys(const std::string& token, const Nonce& server_nonce,
                            const Nonce& worker_nonce, uint32_t rank, ConnectionKeys* keys);

// The scheduler's messages (BYTEPS_ENCRYPT): keys per registration, from the token, the
// scheduler's challenge and the node's nonce (both as they travel, in hex), one per
// direction; each message sealed alone under its sequence number, which travels with
// it. A receiver takes only numbers above the last it opened, so a message may be lost
// (ZeroMQ drops some for a peer that does not read) but never replayed or reordered.
struct ControlKeys {
  SealKey node_to_scheduler;
  SealKey scheduler_to_node;
};
Status DeriveControlKeys(const std::string& token, const std::string& scheduler_nonce,
                         const std::string& node_nonce, ControlKeys* keys);
Status SealMessage(const SealKey& key, uint64_t sequence, const std::string& clear,
                   std::string* sealed);
// False when `sealed` does not authenticate under `key` and `sequence`.
bool OpenMessage(const SealKey& key, uint64_t sequence, const std::string& sealed,
                 std::string* clear);

// Seals the records one side sends, or opens those it receives: one direction of one
// connection, used by one thread at a time.
class RecordCipher {
 public:
  static constexpr size_t kTagBytes = 16;
  using Tag = std::array<uint8_t, kTagBytes>;

  enum class Role { kSeal, kOpen };
  static Status Create(const SealKey& key, Role role, std::unique_ptr<RecordCipher>* out);
  ~RecordCipher();
  RecordCipher(const RecordCipher&) = delete;
  RecordCipher& operator=(const RecordCipher&) = delete;

  // kSeal: a record of `clear` bytes that only need authenticating (a frame header).
  Status TagClear(const void* clear, size_t bytes, Tag* tag);
  // kSeal: a record sealed piece by piece (a payload sent while it is encrypted):
  // Begin, Encrypt `in` to `out` (same length; they may be the same memory) as often
  // as needed, then Finish for its tag.
  Status Begin();
  Status Encrypt(const void* in, void* out, size_t bytes);
  Status Finish(Tag* tag);

  // kOpen: false when the record does not authenticate (then nothing opens any more).
  bool CheckClear(const void* clear, size_t bytes, const Tag& tag);
  // kOpen: a whole record, decrypted in place.
  bool Open(void* data, size_t bytes, const Tag& tag);

 private:
  RecordCipher(void* context, Role role) : context_(context), role_(role) {}
  // The nonce of the next record; false once 2^64 records were counted.
  bool NextNonce(uint8_t nonce[12]);

  // A message's cipher starts its count at the message's sequence number.
  friend Status SealMessage(const SealKey&, uint64_t, const std::string&, std::string*);
  friend bool OpenMessage(const SealKey&, uint64_t, const std::string&, std::string*);

  void* context_;  // EVP_CIPHER_CTX, kept out of this header
  const Role role_;
  uint64_t records_ = 0;
  bool broken_ = false;  // a record failed: the stream is out of step for good
};

}  // namespace bps

#endif  // TF_BPS_WIRE_CRYPTO_H_
