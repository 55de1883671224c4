// Unit tests of the gradient compressors (custom_ops/compression/compressor.h): each
// format's bytes on small hand-computed vectors, what survives a round trip, randomk's
// agreement between workers, the checks of untrusted input, error feedback and momentum,
// and the spec's text. BenchmarkCompressors prints each compressor's speed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../../custom_ops/compression/compressor.h"
#include "../../custom_ops/compression/internal.h"
#include "expect.h"

namespace bps {
namespace {

CompressorSpec Spec(const std::string& text) {
  CompressorSpec spec;
  const Status status = ParseCompressorSpec(text, &spec);
  if (!status.ok()) std::cerr << text << ": " << status.message() << "\n";
  EXPECT(status.ok());
  return spec;
}

std::unique_ptr<Compressor> Make(const std::string& text) { return MakeCompressor(Spec(text)); }

std::string Compressed(const Compressor& compressor, const std::vector<float>& x,
                       uint64_t stream = 0, uint32_t round = 0) {
  std::string out(compressor.CompressedBytes(x.size()), '\0');
  compressor.Compress(x.data(), x.size(), stream, round, out.data());
  return out;
}

std::vector<float> Decompressed(const Compressor& compressor, const std::string& bytes, size_t n) {
  EXPECT(bytes.size() == compressor.CompressedBytes(n));
  EXPECT(compressor.Valid(bytes.data(), n));
  std::vector<float> out(n, 7.0f), added(n, 1.0f);
  compressor.Decompress(bytes.data(), n, out.data());
  compressor.DecompressAdd(bytes.data(), n, added.data());
  for (size_t i = 0; i < n; ++i)
    EXPECT(added[i] == out[i] + 1.0f || (std::isnan(added[i]) && std::isnan(out[i])));
  return out;
}

std::string Bytes(std::initializer_list<int> bytes) {
  std::string out;
  for (int byte : bytes) out.push_back(static_cast<char>(byte));
  return out;
}

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& v : x) v = normal(generator);
  return x;
}

// ---------------------------------------------------------------------------
// Formats, by hand

void TestCompressionFormats() {
  EXPECT(SparseCount(0.5, 5) == 2 && SparseCount(0.1, 5) == 1 && SparseCount(0.1, 0) == 0);
  EXPECT(SparseCount(3, 5) == 3 && SparseCount(10, 5) == 5 && SparseCount(1e30, 5) == 5);
  // splitmix64's published sequence from state 0.
  EXPECT(compression::SplitMix(0) == 0xE220A8397B1DCDAFULL);
  EXPECT(compression::SplitMix(compression::kGoldenGamma) == 0x6E789E6AA1B965F4ULL);

  const std::vector<float> signs = {1, -2, 0, -0.0f, 3};
  auto onebit = Make("onebit scaling=true");
  EXPECT(Compressed(*onebit, signs) == Bytes({0x0A, 0, 0, 0, 0x9A, 0x99, 0x99, 0x3F}));
  EXPECT(Decompressed(*onebit, Compressed(*onebit, signs), 5) ==
         std::vector<float>({1.2f, -1.2f, 1.2f, -1.2f, 1.2f}));
  EXPECT(Compressed(*Make("onebit"), signs) == Bytes({0x0A, 0, 0, 0, 0, 0, 0x80, 0x3F}));
  std::vector<float> long_signs(33, 1.0f);
  long_signs[32] = -1.0f;
  long_signs[31] = -1.0f;
  EXPECT(Compressed(*onebit, long_signs) == Bytes({0, 0, 0, 0x80, 1, 0, 0, 0, 0, 0, 0x80, 0x3F}));
  EXPECT(Compressed(*onebit, {}) == Bytes({0, 0, 0, 0}));

  // Three of magnitude 2: the lower indices win.
  const std::vector<float> ties = {1, -2, 2, 0.5f, -2};
  auto topk = Make("topk k=2");
  EXPECT(Compressed(*topk, ties) == Bytes({1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0xC0, 0, 0, 0, 0x40}));
  EXPECT(Decompressed(*topk, Compressed(*topk, ties), 5) == std::vector<float>({0, -2, 2, 0, 0}));
  EXPECT(Compressed(*Make("topk k=0.2"), ties) == Bytes({1, 0, 0, 0, 0, 0, 0, 0xC0}));
  EXPECT(Compressed(*Make("topk k=9"), {0.5f, -1}) ==
         Bytes({0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x3F, 0, 0, 0x80, 0xBF}));
  EXPECT(Make("randomk k=0.5")->CompressedBytes(7) == 24);

  auto linear = Make("dithering k=2");
  EXPECT(Compressed(*linear, {2, -1, 0, -2}) == Bytes({0, 0, 0, 0x40, 2, 0xFF, 0, 0xFE}));
  EXPECT(Decompressed(*linear, Compressed(*linear, {2, -1, 0, -2}), 4) ==
         std::vector<float>({2, -1, 0, -2}));
  auto natural = Make("dithering k=3 partition=natural");
  EXPECT(Compressed(*natural, {4, -1, 2, 0}) == Bytes({0, 0, 0x80, 0x40, 3, 0xFF, 2, 0}));
  EXPECT(Decompressed(*natural, Compressed(*natural, {4, -1, 2, 0}), 4) ==
         std::vector<float>({4, -1, 2, 0}));
  auto l2 = Make("dithering k=2 normalize=l2");
  EXPECT(Compressed(*l2, {1, 1, -1, 1}) == Bytes({0, 0, 0, 0x40, 1, 1, 0xFF, 1}));
  EXPECT(Compressed(*l2, {0, 0}) == Bytes({0, 0, 0, 0, 0, 0}));

  auto fp16 = Make("fp16");
  const std::vector<float> halves = {1, -2, 65504, 65520, 1e-8f, 0.1f, 0x1p-24f, 0x1.8p-24f};
  EXPECT(Compressed(*fp16, halves) == Bytes({0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B, 0x00, 0x7C, 0, 0,
                                             0x66, 0x2E, 0x01, 0x00, 0x02, 0x00}));
}

// ---------------------------------------------------------------------------
// Round trips

// topk keeps exactly the K largest magnitudes, the lower index first among equals.
void CheckTopk(const std::vector<float>& x, double k) {
  auto topk = MakeCompressor(Spec("topk k=" + std::to_string(k)));
  const size_t count = SparseCount(k, x.size());
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  std::vector<float> want(x.size(), 0.0f);
  for (size_t j = 0; j < count; ++j) want[order[j]] = x[order[j]];
  const std::string bytes = Compressed(*topk, x);
  EXPECT(Decompressed(*topk, bytes, x.size()) == want);
  // An unaligned output takes the scratch path: the same bytes.
  std::string unaligned(bytes.size() + 1, '\0');
  topk->Compress(x.data(), x.size(), 0, 0, unaligned.data() + 1);
  EXPECT(unaligned.substr(1) == bytes);
}

void TestTopkAndRandomk() {
  CheckTopk(Gaussian(1000, 1), 0.05);
  CheckTopk(Gaussian(1000, 2), 0.9);
  CheckTopk(Gaussian(5000, 3), 1);
  // Many ties; ascending magnitudes (every element enters a heap). Large K selects by
  // radix, small K by a heap: both.
  std::vector<float> few(200000), ascending(100000);
  for (size_t i = 0; i < few.size(); ++i) few[i] = static_cast<float>(int(i * 7919 % 11) - 5);
  for (size_t i = 0; i < ascending.size(); ++i) ascending[i] = static_cast<float>(i);
  for (double k : {0.0005, 0.3}) {
    CheckTopk(few, k);
    CheckTopk(ascending, k);
  }
  std::vector<float> nan = {1, std::nanf(""), -3, 2};
  EXPECT(std::isnan(Decompressed(*Make("topk k=1"), Compressed(*Make("topk k=1"), nan), 4)[1]));

  // randomk: the same on two workers, another choice each round and partition.
  const std::vector<float> x = Gaussian(1000, 4);
  auto a = Make("randomk k=0.1 seed=5"), b = Make("randomk k=0.1 seed=5");
  const std::string first = Compressed(*a, x, 3, 7);
  EXPECT(first == Compressed(*b, x, 3, 7));
  EXPECT(first != Compressed(*b, x, 3, 8) && first != Compressed(*b, x, 4, 7));
  EXPECT(first != Compressed(*Make("randomk k=0.1 seed=6"), x, 3, 7));
  std::string unaligned(first.size() + 1, '\0');
  a->Compress(x.data(), x.size(), 3, 7, unaligned.data() + 1);
  EXPECT(unaligned.substr(1) == first);
  const std::vector<float> kept = Decompressed(*a, first, x.size());
  size_t nonzero = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT(kept[i] == 0 || kept[i] == x[i]);
    nonzero += kept[i] != 0;
  }
  EXPECT(nonzero == 100);
  EXPECT(Compressed(*Make("randomk k=5"), {1, 2, 3}) ==
         Compressed(*Make("topk k=5"), {1, 2, 3}));  // All of them.
  // Uniform: every index about as often (3 of 10, 4000 rounds: 1200 +- 29 each).
  auto three = Make("randomk k=3");
  std::vector<int> counts(10, 0);
  const std::vector<float> ten(10, 1.0f);
  for (uint32_t round = 0; round < 4000; ++round) {
    const std::vector<float> chosen = Decompressed(*three, Compressed(*three, ten, 0, round), 10);
    for (size_t i = 0; i < 10; ++i) counts[i] += chosen[i] != 0;
  }
  for (int count : counts) EXPECT(count > 1080 && count < 1320);
}

void TestFp16AndOnebit() {
  // Every half comes back as itself (NaNs as NaNs), as _Float16 reads it.
  auto fp16 = Make("fp16");
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    _Float16 reference;
    std::memcpy(&reference, &half, 2);
    const std::string bytes(reinterpret_cast<const char*>(&half), 2);
    const float value = Decompressed(*fp16, bytes, 1)[0];
    EXPECT(std::isnan(value) ? std::isnan(static_cast<float>(reference))
                             : value == static_cast<float>(reference));
    if (!std::isnan(value)) EXPECT(Compressed(*fp16, {value}) == bytes);
  }
  // Floats round as _Float16's conversion rounds (to nearest even), a sample of them all.
  for (uint64_t bits = 0; bits < (1ULL << 32); bits += 9973) {
    const float value = compression::FloatOf(static_cast<uint32_t>(bits));
    const std::string bytes = Compressed(*fp16, {value});
    const _Float16 reference = static_cast<_Float16>(value);
    if (std::isnan(value)) {
      EXPECT(std::isnan(Decompressed(*fp16, bytes, 1)[0]));
    } else {
      EXPECT(std::memcmp(bytes.data(), &reference, 2) == 0);
    }
  }
  // Within half precision: relative 2^-11 for normal halves.
  const std::vector<float> x = Gaussian(1000, 5);
  const std::vector<float> back = Decompressed(*fp16, Compressed(*fp16, x), x.size());
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT(std::fabs(back[i] - x[i]) <= std::max(std::fabs(x[i]) * 0x1p-11f, 0x1p-25f));

  auto onebit = Make("onebit scaling=true");
  double sum = 0;
  for (float v : x) sum += std::fabs(v);
  const std::vector<float> signs = Decompressed(*onebit, Compressed(*onebit, x), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT(std::signbit(signs[i]) == std::signbit(x[i]));
    EXPECT(std::fabs(std::fabs(signs[i]) - sum / x.size()) <= 1e-6 * sum / x.size());
  }
}

// The mean over many rounds comes close to x, and every value is a level.
void CheckDithering(const std::string& text, const std::vector<float>& x,
                    const std::vector<float>& levels) {
  auto dithering = Make(text);
  const int rounds = 20000;
  std::vector<double> mean(x.size(), 0.0);
  float norm = 0;
  for (int round = 0; round < rounds; ++round) {
    const std::string bytes = Compressed(*dithering, x, 9, round);
    std::memcpy(&norm, bytes.data(), 4);
    const std::vector<float> back = Decompressed(*dithering, bytes, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      mean[i] += back[i] / rounds;
      bool level = false;
      for (float l : levels) level |= std::fabs(back[i]) == l * norm;
      EXPECT(level);
      EXPECT(back[i] == 0 || std::signbit(back[i]) == std::signbit(x[i]));
    }
  }
  for (size_t i = 0; i < x.size(); ++i) EXPECT(std::fabs(mean[i] - x[i]) < 0.01 * norm);
}

void TestDithering() {
  const std::vector<float> x = {0.9f, -0.3f, 0.05f, -1.0f, 0.66f, 0.0f, -0.01f, 0.45f};
  CheckDithering("dithering k=4", x, {0, 0.25f, 0.5f, 0.75f, 1});
  CheckDithering("dithering k=3 partition=natural", x, {0, 0.25f, 0.5f, 1});
  CheckDithering("dithering k=2 normalize=l2", x, {0, 0.5f, 1});
  CheckDithering("dithering k=5 partition=natural normalize=l2", x,
                 {0, 1.0f / 16, 1.0f / 8, 0.25f, 0.5f, 1});
  // Another seed, another rounding; the same seed, the same.
  const std::vector<float> y = Gaussian(1000, 6);
  EXPECT(Compressed(*Make("dithering k=4 seed=1"), y) ==
         Compressed(*Make("dithering k=4 seed=1"), y));
  EXPECT(Compressed(*Make("dithering k=4 seed=1"), y) !=
         Compressed(*Make("dithering k=4 seed=2"), y));
}

// ---------------------------------------------------------------------------
// Untrusted input

void TestCompressionValidity() {
  auto topk = Make("topk k=2");
  auto bytes = [](std::initializer_list<uint32_t> words) {
    std::string out;
    for (uint32_t word : words) out.append(reinterpret_cast<const char*>(&word), 4);
    return out;
  };
  const uint32_t one = 0x3F800000, nan = 0x7FC00000, inf = 0x7F800000, minus = 0xBF800000;
  EXPECT(topk->Valid(bytes({0, 4, one, one}).data(), 5));
  EXPECT(!topk->Valid(bytes({0, 5, one, one}).data(), 5));  // out of range
  EXPECT(!topk->Valid(bytes({3, 1, one, one}).data(), 5));  // unsorted
  EXPECT(!topk->Valid(bytes({2, 2, one, one}).data(), 5));  // twice
  EXPECT(!Make("randomk k=2")->Valid(bytes({4, 1, one, one}).data(), 5));
  auto onebit = Make("onebit scaling=true");
  EXPECT(onebit->Valid(bytes({5, one}).data(), 3));
  EXPECT(onebit->Valid(bytes({5, 0}).data(), 3));
  for (uint32_t scale : {nan, inf, minus}) EXPECT(!onebit->Valid(bytes({5, scale}).data(), 3));
  auto dithering = Make("dithering k=3");
  EXPECT(dithering->Valid(Bytes({0, 0, 0x80, 0x3F, 3, 0xFD, 0}).data(), 3));
  EXPECT(!dithering->Valid(Bytes({0, 0, 0x80, 0x3F, 4, 0, 0}).data(), 3));
  EXPECT(!dithering->Valid(Bytes({0, 0, 0x80, 0x3F, 0, 0xFC, 0}).data(), 3));
  EXPECT(!dithering->Valid(Bytes({0, 0, 0x80, 0x80, 0, 0x80, 0}).data(), 3));
  EXPECT(!dithering->Valid(Bytes({0, 0, 0xC0, 0x7F, 0, 0, 0}).data(), 3));
  EXPECT(!dithering->Valid(Bytes({0, 0, 0x80, 0xBF, 0, 0, 0}).data(), 3));
  // A NaN or infinity in the input gives what Valid refuses: it shows, not sums.
  const std::vector<float> bad = {1, std::numeric_limits<float>::infinity(), 2};
  const std::vector<float> worse = {1, std::nanf(""), 2};
  for (const auto& x : {bad, worse}) {
    EXPECT(!onebit->Valid(Compressed(*onebit, x).data(), 3));
    EXPECT(!dithering->Valid(Compressed(*dithering, x).data(), 3));
    auto l2 = Make("dithering k=3 normalize=l2");
    EXPECT(!l2->Valid(Compressed(*l2, x).data(), 3));
  }
}

// ---------------------------------------------------------------------------
// Error feedback and momentum

// Over 20 steps, what was sent plus the last residual sums to what came in.
void CheckErrorFeedback(const std::string& text) {
  const CompressorSpec spec = Spec(text + " ef=vanilla");
  auto compressor = MakeCompressor(spec);
  const size_t n = 300;
  CompressionState state(spec, compressor.get(), n);
  std::vector<double> inputs(n, 0.0), sent(n, 0.0);
  double magnitude = 0;
  std::string bytes(compressor->CompressedBytes(n), '\0');
  for (uint32_t step = 0; step < 20; ++step) {
    const std::vector<float> g = Gaussian(n, 100 + step);
    state.Compress(g.data(), 11, step, 1.0, bytes.data());
    const std::vector<float> back = Decompressed(*compressor, bytes, n);
    for (size_t i = 0; i < n; ++i) {
      inputs[i] += g[i];
      sent[i] += back[i];
      magnitude += std::fabs(g[i]);
    }
  }
  double error = 0;
  for (size_t i = 0; i < n; ++i) error += std::fabs(sent[i] + state.residual()[i] - inputs[i]);
  if (!(error <= 1e-5 * magnitude)) std::cerr << text << ": off by " << error << "\n";
  EXPECT(error <= 1e-5 * magnitude);
}

void TestCompressionState() {
  for (const char* text : {"topk k=0.1", "randomk k=0.05 seed=3", "onebit scaling=true",
                           "dithering k=4", "dithering k=3 partition=natural normalize=l2", "fp16"})
    CheckErrorFeedback(text);

  // residual_scale: step 2's residual counts twice.
  const CompressorSpec ef = Spec("topk k=1 ef=vanilla");
  auto topk = MakeCompressor(ef);
  CompressionState state(ef, topk.get(), 2);
  std::string bytes(8, '\0');
  const float first[] = {1.0f, 0.5f}, second[] = {0.0f, 0.1f};
  state.Compress(first, 0, 0, 1.0, bytes.data());
  EXPECT(Decompressed(*topk, bytes, 2) == std::vector<float>({1.0f, 0.0f}));
  EXPECT(state.residual() == std::vector<float>({0.0f, 0.5f}));
  state.Compress(second, 0, 1, 2.0, bytes.data());
  EXPECT(Decompressed(*topk, bytes, 2) == std::vector<float>({0.0f, 0.1f + 0.5f * 2.0f}));
  EXPECT(state.residual() == std::vector<float>({0.0f, 0.0f}));

  // Nesterov momentum (topk sending everything shows g' as it is):
  //   m = mu m + g;  g' = g + mu m.
  const CompressorSpec nesterov = Spec("topk k=4 momentum=nesterov mu=0.5");
  auto all = MakeCompressor(nesterov);
  CompressionState moving(nesterov, all.get(), 4);
  std::vector<float> m(4, 0.0f);
  std::string sent(all->CompressedBytes(4), '\0');
  for (uint32_t step = 0; step < 5; ++step) {
    const std::vector<float> g = Gaussian(4, 200 + step);
    std::vector<float> want(4);
    for (size_t i = 0; i < 4; ++i) {
      m[i] = 0.5f * m[i] + g[i];
      want[i] = g[i] + 0.5f * m[i];
    }
    moving.Compress(g.data(), 0, step, 1.0, sent.data());
    EXPECT(Decompressed(*all, sent, 4) == want);
  }
  // Momentum, then error feedback on what it gives.
  const CompressorSpec both = Spec("topk k=1 ef=vanilla momentum=nesterov mu=0.5");
  auto one = MakeCompressor(both);
  CompressionState mixed(both, one.get(), 2);
  const float g1[] = {2.0f, 1.0f}, g2[] = {0.0f, 0.0f};
  mixed.Compress(g1, 0, 0, 1.0, bytes.data());  // m = (2, 1), g' = e = (3, 1.5)
  EXPECT(Decompressed(*one, bytes, 2) == std::vector<float>({3.0f, 0.0f}));
  EXPECT(mixed.residual() == std::vector<float>({0.0f, 1.5f}));
  mixed.Compress(g2, 0, 1, 1.0, bytes.data());  // m = (1, 0.5), g' = (0.5, 0.25), e = (0.5, 1.75)
  EXPECT(Decompressed(*one, bytes, 2) == std::vector<float>({0.0f, 1.75f}));
  EXPECT(mixed.residual() == std::vector<float>({0.5f, 0.0f}));
}

// ---------------------------------------------------------------------------
// The spec's text

void TestCompressorSpecs() {
  const std::vector<std::pair<std::string, std::string>> canonical = {
      {"", "none"},
      {" none ", "none"},
      {"onebit", "onebit scaling=false ef=none momentum=none"},
      {"onebit scaling=true ef=vanilla", "onebit scaling=true ef=vanilla momentum=none"},
      {"topk k=0.01", "topk k=0.01 ef=none momentum=none"},
      {"topk  momentum=nesterov k=1e3", "topk k=1000 ef=none momentum=nesterov mu=0.9"},
      {"randomk k=0.25 seed=18446744073709551615 ef=vanilla momentum=nesterov mu=0.5",
       "randomk k=0.25 ef=vanilla momentum=nesterov mu=0.5 seed=18446744073709551615"},
      {"dithering k=7 normalize=l2 partition=natural",
       "dithering k=7 partition=natural normalize=l2 ef=none momentum=none seed=0"},
      {"fp16\tef=vanilla", "fp16 ef=vanilla momentum=none"},
  };
  for (const auto& [text, want] : canonical) {
    const CompressorSpec spec = Spec(text);
    EXPECT(FormatCompressorSpec(spec) == want);
    EXPECT(Spec(FormatCompressorSpec(spec)) == spec);
  }
  // Numbers come back exactly.
  CompressorSpec exact = Spec("topk k=0.1 momentum=nesterov");
  for (double k : {1.0 / 3, 0.1 + 0.2, 1e-7, 0.999999999999}) {
    for (double mu : {1.0 / 3, 0.0, 0.9999999999999999}) {
      exact.k = k;
      exact.mu = mu;
      EXPECT(Spec(FormatCompressorSpec(exact)) == exact);
    }
  }
  const std::string last = FormatCompressorSpec(exact);
  EXPECT(last.substr(last.size() - 21) == "mu=0.9999999999999999");

  const std::vector<std::pair<std::string, std::string>> refusals = {
      {"foo", "unknown compressor 'foo'"},
      {"topk kk=1", "unknown key 'kk'"},
      {"topk k=0.1 scaling=true", "key 'scaling' does not apply to topk"},
      {"onebit k=2", "key 'k' does not apply to onebit"},
      {"topk k=0.1 seed=1", "key 'seed' does not apply to topk"},
      {"fp16 partition=linear", "key 'partition' does not apply to fp16"},
      {"randomk k=1 normalize=max", "key 'normalize' does not apply to randomk"},
      {"none ef=vanilla", "key 'ef' does not apply to none"},
      {"topk k", "'k' is not key=value"},
      {"topk", "key 'k' is required (topk)"},
      {"dithering seed=1", "key 'k' is required (dithering)"},
      {"topk k=0", "k=0 must be > 0 (topk)"},
      {"randomk k=-1", "k=-1 must be > 0 (randomk)"},
      {"topk k=nan", "k=nan must be > 0 (topk)"},
      {"topk k=1.5", "k=1.5 must be an integer when >= 1 (topk)"},
      {"topk k=inf", "k=inf must be an integer when >= 1 (topk)"},
      {"topk k=abc", "k=abc is not a number (topk)"},
      {"topk k=", "k= is not a number (topk)"},
      {"dithering k=0", "k=0 must be an integer from 1 to 127 (dithering)"},
      {"dithering k=128", "k=128 must be an integer from 1 to 127 (dithering)"},
      {"dithering k=2.5", "k=2.5 must be an integer from 1 to 127 (dithering)"},
      {"topk k=0.1 k=0.2", "key 'k' is given twice"},
      {"onebit scaling=yes", "scaling=yes must be true or false"},
      {"dithering k=2 partition=log", "partition=log must be linear or natural"},
      {"dithering k=2 normalize=l1", "normalize=l1 must be max or l2"},
      {"fp16 ef=corrected", "ef=corrected must be vanilla or none"},
      {"fp16 momentum=heavy", "momentum=heavy must be nesterov or none"},
      {"fp16 momentum=nesterov mu=1", "mu=1 must be >= 0 and < 1"},
      {"fp16 momentum=nesterov mu=-0.1", "mu=-0.1 must be >= 0 and < 1"},
      {"fp16 momentum=nesterov mu=x", "mu=x is not a number"},
      {"fp16 mu=0.5", "key 'mu' applies only with momentum=nesterov"},
      {"randomk k=0.1 seed=-1", "seed=-1 must be an integer from 0 to 18446744073709551615"},
      {"randomk k=0.1 seed=18446744073709551616",
       "seed=18446744073709551616 must be an integer from 0 to 18446744073709551615"},
  };
  for (const auto& [text, want] : refusals) {
    CompressorSpec spec;
    spec.kind = CompressorSpec::Kind::kFp16;
    const Status status = ParseCompressorSpec(text, &spec);
    EXPECT(status.kind() == ErrorKind::kInvalidArgument);
    if (status.message() != "compression: " + want)
      std::cerr << text << ": " << status.message() << "\n";
    EXPECT(status.message() == "compression: " + want);
    EXPECT(spec.kind == CompressorSpec::Kind::kFp16);  // Untouched.
  }
  EXPECT(MakeCompressor(Spec("none")) == nullptr);
}

}  // namespace

void TestCompression() {
  TestCompressionFormats();
  TestTopkAndRandomk();
  TestFp16AndOnebit();
  TestDithering();
  TestCompressionValidity();
  TestCompressionState();
  TestCompressorSpecs();
}

// Prints how fast each compressor compresses and decompresses 2^20 float32 elements
// (the time of the best of a few runs); checks nothing.
void BenchmarkCompressors() {
  const size_t n = 1 << 20;
  const std::vector<float> x = Gaussian(n, 7);
  std::vector<float> back(n);
  for (const char* text :
       {"onebit scaling=true", "topk k=0.001", "topk k=0.01", "topk k=0.1", "randomk k=0.01",
        "randomk k=0.1", "dithering k=4", "dithering k=4 partition=natural normalize=l2", "fp16"}) {
    auto compressor = Make(text);
    std::string bytes(compressor->CompressedBytes(n), '\0');
    double compress = 1e9, decompress = 1e9;
    for (uint32_t run = 0; run < 5; ++run) {
      const auto start = std::chrono::steady_clock::now();
      compressor->Compress(x.data(), n, 0, run, bytes.data());
      const auto middle = std::chrono::steady_clock::now();
      compressor->Decompress(bytes.data(), n, back.data());
      const auto end = std::chrono::steady_clock::now();
      compress = std::min(compress, std::chrono::duration<double>(middle - start).count());
      decompress = std::min(decompress, std::chrono::duration<double>(end - middle).count());
    }
    std::printf("compression %-44s compress %7.3f ms (%5.2f GB/s)  decompress %7.3f ms\n", text,
                compress * 1e3, 4.0 * n / compress / 1e9, decompress * 1e3);
  }
}

}  // namespace bps
