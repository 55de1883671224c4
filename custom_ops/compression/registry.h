// The compressors of one process, one per distinct spec: what a worker's tasks and a
// server's rounds look up by the spec's text. Compressors are stateless, so one
// serves every tensor and thread that names its spec; per-partition state lives with
// the partition (CompressionState).
#ifndef TF_BPS_COMPRESSION_REGISTRY_H_
#define TF_BPS_COMPRESSION_REGISTRY_H_

#include <cstddef>
#include <memory>
#include <string>

#include "../common/common.h"
#include "compressor.h"

namespace bps {

struct CompressionSetup {
  CompressorSpec spec;
  std::string text;                        // canonical (FormatCompressorSpec)
  std::unique_ptr<Compressor> compressor;  // null for "none"
};

// At most this many distinct specs per process: a peer cannot make a server keep more.
constexpr size_t kMaxCompressionSetups = 64;

// The setup of `text` (any spelling ParseCompressorSpec reads). Setups live as long as
// the process, so the pointer may be kept. Errors: the parser's, or too many specs.
Status FindCompression(const std::string& text, const CompressionSetup** setup);

}  // namespace bps

#endif  // TF_BPS_COMPRESSION_REGISTRY_H_
