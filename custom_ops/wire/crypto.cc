#include "crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/sha.h>
#include <sys/random.h>

#include <algorithm>
#include <cstring>

namespace bps {
namespace {

constexpr size_t kIvBytes = 12;

EVP_CIPHER_CTX* Context(void* context) { return static_cast<EVP_CIPHER_CTX*>(context); }

}  // namespace

Digest Sha256(const void* data, size_t bytes) {
  Digest digest;
  ::SHA256(static_cast<const unsigned char*>(data), bytes, digest.data());
  return digest;
}

Digest HmacSha256(const std::string& key, const void* data, size_t bytes) {
  Digest digest;
  unsigned int length = 0;
  ::HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
         static_cast<const unsigned char*>(data), bytes, digest.data(), &length);
  return digest;
}

bool SameDigest(const Digest& a, const Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Status RandomNonce(Nonce* nonce) {
  if (::getrandom(nonce->data(), nonce->size(), 0) != static_cast<ssize_t>(nonce->size()))
    return Status::Error("no randomness for a handshake nonce");
  return Status::OK();
}

namespace {

// HKDF-SHA256 of the token, `salt` and `info` into `out` (`bytes` long).
Status DeriveKeys(const std::string& token, const std::string& salt, const std::string& info,
                  uint8_t* out, size_t bytes) {
  size_t length = bytes;
  EVP_PKEY_CTX* kdf = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  const auto* salt_bytes = reinterpret_cast<const unsigned char*>(salt.data());
  const bool ok =
      kdf && EVP_PKEY_derive_init(kdf) > 0 && EVP_PKEY_CTX_set_hkdf_md(kdf, EVP_sha256()) > 0 &&
      EVP_PKEY_CTX_set1_hkdf_salt(kdf, salt_bytes, static_cast<int>(salt.size())) > 0 &&
      EVP_PKEY_CTX_set1_hkdf_key(kdf, reinterpret_cast<const unsigned char*>(token.data()),
                                 static_cast<int>(token.size())) > 0 &&
      EVP_PKEY_CTX_add1_hkdf_info(kdf, reinterpret_cast<const unsigned char*>(info.data()),
                                  static_cast<int>(info.size())) > 0 &&
      EVP_PKEY_derive(kdf, out, &length) > 0 && length == bytes;
  EVP_PKEY_CTX_free(kdf);
  return ok ? Status::OK() : Status::Error("deriving keys failed (OpenSSL HKDF)");
}

// Two keys of one derivation, in order.
Status DerivePair(const std::string& token, const std::string& salt, const std::string& info,
                  SealKey* first, SealKey* second) {
  uint8_t derived[2 * sizeof(SealKey)];
  Status status = DeriveKeys(token, salt, info, derived, sizeof(derived));
  if (status.ok()) {
    std::memcpy(first->data(), derived, sizeof(SealKey));
    std::memcpy(second->data(), derived + sizeof(SealKey), sizeof(SealKey));
  }
  OPENSSL_cleanse(derived, sizeof(derived));
  return status;
}

}  // namespace

Status DeriveConnectionKeys(const std::string& token, const Nonce& server_nonce,
                            const Nonce& worker_nonce, uint32_t rank, ConnectionKeys* keys) {
  std::string salt(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  salt.append(reinterpret_cast<const char*>(worker_nonce.data()), worker_nonce.size());
  return DerivePair(token, salt, "tf_bps connection keys, worker " + std::to_string(rank),
                    &keys->worker_to_server, &keys->server_to_worker);
}

Status DeriveControlKeys(const std::string& token, const std::string& scheduler_nonce,
                         const std::string& node_nonce, ControlKeys* keys) {
  return DerivePair(token, scheduler_nonce + "|" + node_nonce, "tf_bps control keys",
                    &keys->node_to_scheduler, &keys->scheduler_to_node);
}

Status SealMessage(const SealKey& key, uint64_t sequence, const std::string& clear,
                   std::string* sealed) {
  std::unique_ptr<RecordCipher> cipher;
  Status status = RecordCipher::Create(key, RecordCipher::Role::kSeal, &cipher);
  if (!status.ok()) return status;
  cipher->records_ = sequence;
  RecordCipher::Tag tag;
  sealed->assign(clear.size(), '\0');
  status = cipher->Begin();
  if (status.ok()) status = cipher->Encrypt(clear.data(), sealed->data(), clear.size());
  if (status.ok()) status = cipher->Finish(&tag);
  sealed->append(reinterpret_cast<const char*>(tag.data()), tag.size());
  return status;
}

bool OpenMessage(const SealKey& key, uint64_t sequence, const std::string& sealed,
                 std::string* clear) {
  std::unique_ptr<RecordCipher> cipher;
  if (sealed.size() < RecordCipher::kTagBytes ||
      !RecordCipher::Create(key, RecordCipher::Role::kOpen, &cipher).ok())
    return false;
  cipher->records_ = sequence;
  RecordCipher::Tag tag;
  const size_t bytes = sealed.size() - tag.size();
  std::memcpy(tag.data(), sealed.data() + bytes, tag.size());
  clear->assign(sealed, 0, bytes);
  return cipher->Open(clear->data(), bytes, tag);
}

// ---------------------------------------------------------------------------
// RecordCipher

Status RecordCipher::Create(const SealKey& key, Role role, std::unique_ptr<RecordCipher>* out) {
  EVP_CIPHER_CTX* context = EVP_CIPHER_CTX_new();
  const bool ok =
      context &&
      (role == Role::kSeal
           ? EVP_EncryptInit_ex(context, EVP_aes_256_gcm(), nullptr, key.data(), nullptr)
           : EVP_DecryptInit_ex(context, EVP_aes_256_gcm(), nullptr, key.data(), nullptr)) == 1;
  if (!ok) {
    EVP_CIPHER_CTX_free(context);
    return Status::Error("setting up AES-256-GCM failed (OpenSSL)");
  }
  out->reset(new RecordCipher(context, role));
  return Status::OK();
}

RecordCipher::~RecordCipher() { EVP_CIPHER_CTX_free(Context(context_)); }

bool RecordCipher::NextNonce(uint8_t nonce[kIvBytes]) {
  if (broken_ || records_ == UINT64_MAX) return false;
  std::memset(nonce, 0, kIvBytes);
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<uint8_t>(records_ >> (8 * i));
  ++records_;
  return true;
}

Status RecordCipher::Begin() {
  uint8_t nonce[kIvBytes];
  if (role_ != Role::kSeal || !NextNonce(nonce) ||
      EVP_EncryptInit_ex(Context(context_), nullptr, nullptr, nullptr, nonce) != 1) {
    broken_ = true;
    return Status::Error("sealing a frame failed (OpenSSL)");
  }
  return Status::OK();
}

Status RecordCipher::Encrypt(const void* in, void* out, size_t bytes) {
  const auto* from = static_cast<const unsigned char*>(in);
  auto* to = static_cast<unsigned char*>(out);
  while (bytes > 0) {  // EVP takes an int's worth at a time.
    const int chunk = static_cast<int>(std::min<size_t>(bytes, 1 << 30));
    int written = 0;
    if (EVP_EncryptUpdate(Context(context_), to, &written, from, chunk) != 1 || written != chunk) {
      broken_ = true;
      return Status::Error("sealing a frame failed (OpenSSL)");
    }
    from += chunk;
    to += chunk;
    bytes -= static_cast<size_t>(chunk);
  }
  return Status::OK();
}

Status RecordCipher::Finish(Tag* tag) {
  int written = 0;
  unsigned char none[16];
  if (EVP_EncryptFinal_ex(Context(context_), none, &written) != 1 ||
      EVP_CIPHER_CTX_ctrl(Context(context_), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag->data()) != 1) {
    broken_ = true;
    return Status::Error("sealing a frame failed (OpenSSL)");
  }
  return Status::OK();
}

Status RecordCipher::TagClear(const void* clear, size_t bytes, Tag* tag) {
  int written = 0;
  Status status = Begin();
  if (status.ok() &&
      EVP_EncryptUpdate(Context(context_), nullptr, &written,
                        static_cast<const unsigned char*>(clear), static_cast<int>(bytes)) != 1) {
    broken_ = true;
    status = Status::Error("sealing a frame failed (OpenSSL)");
  }
  return status.ok() ? Finish(tag) : status;
}

bool RecordCipher::CheckClear(const void* clear, size_t bytes, const Tag& tag) {
  uint8_t nonce[kIvBytes];
  int written = 0;
  unsigned char none[16];
  EVP_CIPHER_CTX* context = Context(context_);
  const bool ok =
      role_ == Role::kOpen && NextNonce(nonce) &&
      EVP_DecryptInit_ex(context, nullptr, nullptr, nullptr, nonce) == 1 &&
      EVP_DecryptUpdate(context, nullptr, &written, static_cast<const unsigned char*>(clear),
                        static_cast<int>(bytes)) == 1 &&
      EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, kTagBytes,
                          const_cast<uint8_t*>(tag.data())) == 1 &&
      EVP_DecryptFinal_ex(context, none, &written) == 1;
  broken_ = broken_ || !ok;
  return ok;
}

bool RecordCipher::Open(void* data, size_t bytes, const Tag& tag) {
  uint8_t nonce[kIvBytes];
  EVP_CIPHER_CTX* context = Context(context_);
  bool ok = role_ == Role::kOpen && NextNonce(nonce) &&
            EVP_DecryptInit_ex(context, nullptr, nullptr, nullptr, nonce) == 1;
  auto* at = static_cast<unsigned char*>(data);
  while (ok && bytes > 0) {
    const int chunk = static_cast<int>(std::min<size_t>(bytes, 1 << 30));
    int written = 0;
    ok = EVP_DecryptUpdate(context, at, &written, at, chunk) == 1 && written == chunk;
    at += chunk;
    bytes -= static_cast<size_t>(chunk);
  }
  int written = 0;
  unsigned char none[16];
  ok = ok &&
       EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, kTagBytes,
                           const_cast<uint8_t*>(tag.data())) == 1 &&
       EVP_DecryptFinal_ex(context, none, &written) == 1;
  broken_ = broken_ || !ok;
  return ok;
}

}  // namespace bps
