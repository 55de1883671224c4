#include "registry.h"

#include <map>
#include <mutex>

namespace bps {

Status FindCompression(const std::string& text, const CompressionSetup** setup) {
  // Entries are never removed: callers keep their pointers. Keyed by the canonical
  // text, which is what declarations carry; other spellings are parsed first.
  static std::mutex mutex;
  static auto* setups = new std::map<std::string, std::unique_ptr<CompressionSetup>>;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = setups->find(text);
  if (found == setups->end()) {
    CompressorSpec spec;
    Status status = ParseCompressorSpec(text, &spec);
    if (!status.ok()) return status;
    const std::string canonical = FormatCompressorSpec(spec);
    found = setups->find(canonical);
    if (found == setups->end()) {
      if (setups->size() >= kMaxCompressionSetups)
        return Status::Error(ErrorKind::kInvalidArgument,
                             "compression: more than " + std::to_string(kMaxCompressionSetups) +
                                 " different compressor settings in one process");
      auto fresh = std::make_unique<CompressionSetup>();
      fresh->spec = spec;
      fresh->text = canonical;
      fresh->compressor = MakeCompressor(spec);
      found = setups->emplace(canonical, std::move(fresh)).first;
    }
  }
  *setup = found->second.get();
  return Status::OK();
}

}  // namespace bps
