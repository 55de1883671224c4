// The C API's functions that need no worker: the compressors' formats, and the
// control plane's keys and sealed messages (c_api.h).
#include <cstring>
#include <memory>
#include <string>

#include "../compression/compressor.h"
#include "../wire/crypto.h"
#include "c_api.h"
#include "c_api_errors.h"

namespace bps {
namespace {

SealKey KeyAt(const unsigned char* bytes) {
  SealKey key;
  std::memcpy(key.data(), bytes, key.size());
  return key;
}

// The compressor `text` names, or null with this thread's error set.
std::unique_ptr<Compressor> CompressorOf(const char* text) {
  CompressorSpec spec;
  Status status = ParseCompressorSpec(text ? text : "", &spec);
  if (status.ok() && !spec.compresses())
    status = Status::Error(ErrorKind::kInvalidArgument,
                           "compression: '" + std::string(text) + "' does not compress");
  if (!status.ok()) {
    Fail(status);
    return nullptr;
  }
  return MakeCompressor(spec);
}

}  // namespace
}  // namespace bps

using bps::Status;

extern "C" {

int bps_compression_canonical(const char* spec, char* out, int capacity) {
  bps::CompressorSpec parsed;
  const Status status = bps::ParseCompressorSpec(spec ? spec : "", &parsed);
  if (!status.ok()) return bps::Fail(status);
  const std::string text = bps::FormatCompressorSpec(parsed);
  if (capacity <= static_cast<int>(text.size()))
    return bps::Fail("compression: " + std::to_string(capacity) + " bytes cannot hold '" + text +
                     "'");
  std::memcpy(out, text.c_str(), text.size() + 1);
  return static_cast<int>(text.size());
}

long long bps_compressed_bytes(const char* spec, unsigned long long count) {
  const auto compressor = bps::CompressorOf(spec);
  return compressor ? static_cast<long long>(compressor->CompressedBytes(count)) : -1;
}

int bps_compress(const char* spec, const float* values, unsigned long long count,
                 unsigned long long stream, unsigned int round, char* out) {
  const auto compressor = bps::CompressorOf(spec);
  if (!compressor) return -1;
  compressor->Compress(values, count, stream, round, out);
  return 0;
}

int bps_decompress(const char* spec, const char* data, unsigned long long bytes,
                   unsigned long long count, float* out) {
  const auto compressor = bps::CompressorOf(spec);
  if (!compressor) return -1;
  const size_t expected = compressor->CompressedBytes(count);
  if (bytes != expected)
    return bps::Fail("compression: " + std::to_string(bytes) + " bytes for " +
                     std::to_string(count) + " elements, not " + std::to_string(expected));
  if (!compressor->Valid(data, count))
    return bps::Fail("compression: malformed data for '" + std::string(spec) + "'");
  compressor->Decompress(data, count, out);
  return 0;
}

int bps_control_keys(const char* token, const char* scheduler_nonce, const char* node_nonce,
                     unsigned char* keys) {
  bps::ControlKeys derived;
  Status status = bps::DeriveControlKeys(token, scheduler_nonce, node_nonce, &derived);
  std::memcpy(keys, derived.node_to_scheduler.data(), derived.node_to_scheduler.size());
  std::memcpy(keys + derived.node_to_scheduler.size(), derived.scheduler_to_node.data(),
              derived.scheduler_to_node.size());
  return status.ok() ? 0 : bps::Fail(status);
}

int bps_seal_message(const unsigned char* key, unsigned long long sequence, const char* clear,
                     int bytes, char* out) {
  std::string sealed;
  Status status = bps::SealMessage(bps::KeyAt(key), sequence, std::string(clear, bytes), &sealed);
  if (status.ok()) std::memcpy(out, sealed.data(), sealed.size());
  return status.ok() ? 0 : bps::Fail(status);
}

int bps_open_message(const unsigned char* key, unsigned long long sequence, const char* sealed,
                     int bytes, char* out) {
  std::string clear;
  if (!bps::OpenMessage(bps::KeyAt(key), sequence, std::string(sealed, bytes), &clear))
    return bps::Fail(
        Status::Error(bps::ErrorKind::kInvalidArgument, "a control message does not authenticate"));
  std::memcpy(out, clear.data(), clear.size());
  return 0;
}

}  // extern "C"
