// The compressor spec's text form, the factory, and the per-partition state (momentum,
// error feedback) around any compressor.
#include "compressor.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "internal.h"

namespace bps {

// ---------------------------------------------------------------------------
// The spec

bool CompressorSpec::operator==(const CompressorSpec& other) const {
  return kind == other.kind && scaling == other.scaling && k == other.k &&
         partition == other.partition && normalize == other.normalize &&
         error_feedback == other.error_feedback && nesterov == other.nesterov && mu == other.mu &&
         seed == other.seed;
}

const char* CompressorName(CompressorSpec::Kind kind) {
  switch (kind) {
    case CompressorSpec::Kind::kNone:
      return "none";
    case CompressorSpec::Kind::kOnebit:
      return "onebit";
    case CompressorSpec::Kind::kTopk:
      return "topk";
    case CompressorSpec::Kind::kRandomk:
      return "randomk";
    case CompressorSpec::Kind::kDithering:
      return "dithering";
    case CompressorSpec::Kind::kFp16:
      return "fp16";
  }
  return "unknown";
}

size_t SparseCount(double k, size_t n) {
  if (n == 0) return 0;
  if (k < 1) {
    const double count = std::floor(k * static_cast<double>(n));
    return count < 1 ? 1 : static_cast<size_t>(count);
  }
  return k >= static_cast<double>(n) ? n : static_cast<size_t>(std::floor(k));
}

namespace {

using Kind = CompressorSpec::Kind;

Status Invalid(const std::string& message) {
  return Status::Error(ErrorKind::kInvalidArgument, "compression: " + message);
}

// Which kinds take a key: every key but these applies to every kind that compresses.
bool KeyApplies(const std::string& key, Kind kind) {
  if (kind == Kind::kNone) return false;
  if (key == "scaling") return kind == Kind::kOnebit;
  if (key == "k") return kind == Kind::kTopk || kind == Kind::kRandomk || kind == Kind::kDithering;
  if (key == "partition" || key == "normalize") return kind == Kind::kDithering;
  if (key == "seed") return kind == Kind::kRandomk || kind == Kind::kDithering;
  return true;  // ef, momentum, mu
}

bool KnownKey(const std::string& key) {
  static const std::set<std::string> keys = {"scaling", "k",        "partition", "normalize",
                                             "ef",      "momentum", "mu",        "seed"};
  return keys.count(key) != 0;
}

bool ParseNumber(const std::string& text, double* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

Status ParseK(const std::string& text, Kind kind, CompressorSpec* spec) {
  const std::string both = "k=" + text;
  const std::string name = std::string(" (") + CompressorName(kind) + ")";
  double k;
  if (!ParseNumber(text, &k)) return Invalid(both + " is not a number" + name);
  if (kind == Kind::kDithering) {
    if (!(k >= 1 && k <= 127 && k == std::floor(k)))
      return Invalid(both + " must be an integer from 1 to 127" + name);
  } else if (!(k > 0)) {
    return Invalid(both + " must be > 0" + name);
  } else if (k >= 1 && !(std::isfinite(k) && k == std::floor(k))) {
    return Invalid(both + " must be an integer when >= 1" + name);
  }
  spec->k = k;
  return Status::OK();
}

// key=value where value is one of two words: sets *flag to value == first.
Status ParseChoice(const std::string& key, const std::string& value, const char* first,
                   const char* second, bool* flag) {
  if (value != first && value != second)
    return Invalid(key + "=" + value + " must be " + first + " or " + second);
  *flag = value == first;
  return Status::OK();
}

Status ParseSeed(const std::string& value, uint64_t* seed) {
  bool digits = !value.empty() && value.size() <= 20;
  for (char c : value) digits = digits && c >= '0' && c <= '9';
  errno = 0;
  const unsigned long long parsed = digits ? std::strtoull(value.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE)
    return Invalid("seed=" + value + " must be an integer from 0 to 18446744073709551615");
  *seed = parsed;
  return Status::OK();
}

Status ApplyKey(const std::string& key, const std::string& value, CompressorSpec* spec) {
  bool flag = false;
  Status status = Status::OK();
  if (key == "k") return ParseK(value, spec->kind, spec);
  if (key == "seed") return ParseSeed(value, &spec->seed);
  if (key == "mu") {
    double mu;
    if (!ParseNumber(value, &mu)) return Invalid("mu=" + value + " is not a number");
    if (!(mu >= 0 && mu < 1)) return Invalid("mu=" + value + " must be >= 0 and < 1");
    spec->mu = mu;
  } else if (key == "scaling") {
    status = ParseChoice(key, value, "true", "false", &spec->scaling);
  } else if (key == "partition") {
    status = ParseChoice(key, value, "linear", "natural", &flag);
    spec->partition =
        flag ? CompressorSpec::Partition::kLinear : CompressorSpec::Partition::kNatural;
  } else if (key == "normalize") {
    status = ParseChoice(key, value, "max", "l2", &flag);
    spec->normalize = flag ? CompressorSpec::Normalize::kMax : CompressorSpec::Normalize::kL2;
  } else if (key == "ef") {
    status = ParseChoice(key, value, "vanilla", "none", &spec->error_feedback);
  } else if (key == "momentum") {
    status = ParseChoice(key, value, "nesterov", "none", &spec->nesterov);
  }
  return status;
}

bool ParseKind(const std::string& name, Kind* kind) {
  for (Kind candidate :
       {Kind::kNone, Kind::kOnebit, Kind::kTopk, Kind::kRandomk, Kind::kDithering, Kind::kFp16}) {
    if (name == CompressorName(candidate)) {
      *kind = candidate;
      return true;
    }
  }
  return false;
}

// The shortest text strtod reads back as `value` exactly; whole numbers in full.
std::string Number(double value) {
  char text[40];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(text, sizeof(text), "%.0f", value);
    return text;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

}  // namespace

Status ParseCompressorSpec(const std::string& text, CompressorSpec* spec) {
  std::istringstream words(text);
  std::string name, word;
  CompressorSpec parsed;
  if (!(words >> name)) {
    *spec = parsed;
    return Status::OK();
  }
  if (!ParseKind(name, &parsed.kind)) return Invalid("unknown compressor '" + name + "'");
  std::set<std::string> seen;
  while (words >> word) {
    const size_t equals = word.find('=');
    if (equals == std::string::npos) return Invalid("'" + word + "' is not key=value");
    const std::string key = word.substr(0, equals), value = word.substr(equals + 1);
    if (!KnownKey(key)) return Invalid("unknown key '" + key + "'");
    if (!KeyApplies(key, parsed.kind))
      return Invalid("key '" + key + "' does not apply to " + name);
    if (!seen.insert(key).second) return Invalid("key '" + key + "' is given twice");
    Status status = ApplyKey(key, value, &parsed);
    if (!status.ok()) return status;
  }
  if (KeyApplies("k", parsed.kind) && !seen.count("k"))
    return Invalid("key 'k' is required (" + name + ")");
  if (seen.count("mu") && !parsed.nesterov)
    return Invalid("key 'mu' applies only with momentum=nesterov");
  *spec = parsed;
  return Status::OK();
}

std::string FormatCompressorSpec(const CompressorSpec& spec) {
  std::string text = CompressorName(spec.kind);
  if (!spec.compresses()) return text;
  if (spec.kind == Kind::kOnebit) text += spec.scaling ? " scaling=true" : " scaling=false";
  if (KeyApplies("k", spec.kind)) text += " k=" + Number(spec.k);
  if (spec.kind == Kind::kDithering) {
    text += spec.partition == CompressorSpec::Partition::kLinear ? " partition=linear"
                                                                 : " partition=natural";
    text += spec.normalize == CompressorSpec::Normalize::kMax ? " normalize=max" : " normalize=l2";
  }
  text += spec.error_feedback ? " ef=vanilla" : " ef=none";
  text += spec.nesterov ? " momentum=nesterov mu=" + Number(spec.mu) : " momentum=none";
  if (KeyApplies("seed", spec.kind)) text += " seed=" + std::to_string(spec.seed);
  return text;
}

// ---------------------------------------------------------------------------
// Compressors

std::unique_ptr<Compressor> MakeCompressor(const CompressorSpec& spec) {
  switch (spec.kind) {
    case Kind::kNone:
      return nullptr;
    case Kind::kOnebit:
      return compression::MakeOnebit(spec);
    case Kind::kTopk:
      return compression::MakeTopk(spec);
    case Kind::kRandomk:
      return compression::MakeRandomk(spec);
    case Kind::kDithering:
      return compression::MakeDithering(spec);
    case Kind::kFp16:
      return compression::MakeFp16(spec);
  }
  return nullptr;
}

// Every compressor here adds in place; this is for one that does not.
void Compressor::DecompressAdd(const char* in, size_t n, float* out) const {
  thread_local std::vector<float> decompressed;
  if (decompressed.size() < n) decompressed.resize(n);
  Decompress(in, n, decompressed.data());
  for (size_t i = 0; i < n; ++i) out[i] += decompressed[i];
}

namespace compression {

BPS_COMPRESSION_VECTORISE double SumOfMagnitudes(const float* in, size_t n) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += std::fabs(static_cast<double>(in[i + j]));
  for (int j = 0; i < n; ++i, ++j) lanes[j] += std::fabs(static_cast<double>(in[i]));
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

BPS_COMPRESSION_VECTORISE double SumOfSquares(const float* in, size_t n) {
  // A float's square is exact in double, so no product is rounded for FMA to change.
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const double x = in[i + j];
      lanes[j] += x * x;
    }
  for (int j = 0; i < n; ++i, ++j) {
    const double x = in[i];
    lanes[j] += x * x;
  }
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

BPS_COMPRESSION_VECTORISE uint32_t MaxMagnitudeBits(const float* in, size_t n) {
  // Below 2^31, so signed comparisons (which SSE2 and AVX2 have) order them.
  int32_t most = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t bits = static_cast<int32_t>(BitsOf(in[i]) & 0x7fffffffu);
    most = bits > most ? bits : most;
  }
  return static_cast<uint32_t>(most);
}

}  // namespace compression

// ---------------------------------------------------------------------------
// Momentum and error feedback

CompressionState::CompressionState(const CompressorSpec& spec, const Compressor* compressor,
                                   size_t n)
    : spec_(spec),
      compressor_(compressor),
      n_(n),
      momentum_(spec.nesterov ? n : 0, 0.0f),
      residual_(spec.error_feedback ? n : 0, 0.0f),
      work_(spec.nesterov || spec.error_feedback ? n : 0, 0.0f) {}

void CompressionState::Compress(const float* in, uint64_t stream, uint32_t round,
                                double residual_scale, char* out) {
  const float* g = in;
  float* work = work_.data();
  if (spec_.nesterov) {
    const float mu = static_cast<float>(spec_.mu);
    float* m = momentum_.data();
    for (size_t i = 0; i < n_; ++i) {
      m[i] = mu * m[i] + in[i];
      work[i] = in[i] + mu * m[i];
    }
    g = work;
  }
  if (!spec_.error_feedback) {
    compressor_->Compress(g, n_, stream, round, out);
    return;
  }
  // e = g' + residual * scale; the residual becomes e - D(C(e)), decompressed into it.
  const float scale = static_cast<float>(residual_scale);
  float* residual = residual_.data();
  for (size_t i = 0; i < n_; ++i) work[i] = g[i] + residual[i] * scale;
  compressor_->Compress(work, n_, stream, round, out);
  compressor_->Decompress(out, n_, residual);
  for (size_t i = 0; i < n_; ++i) residual[i] = work[i] - residual[i];
}

}  // namespace bps
