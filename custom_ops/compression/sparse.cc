// topk and randomk (BytePS's sparsifiers): K = SparseCount(k, n) elements, sent as
//   K uint32 indices, strictly ascending, then the K float32 elements at them.
// topk keeps the K of largest |x| (ties to the lower index; a NaN counts as larger than
// any number, so it travels); randomk K distinct indices drawn uniformly at random,
// alike on every worker for the same seed, stream and round.
//
// Neither allocates: the output's 8K bytes are their scratch (a heap of K 64-bit keys,
// a hash set of 2K indices, a bitmap of the n indices) before they hold the result.
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "internal.h"

namespace bps {
namespace compression {
namespace {

// The output as T words if it is aligned for them, else a thread's scratch.
template <typename T>
T* WordsAt(char* out, size_t count, std::vector<T>* scratch) {
  if (reinterpret_cast<uintptr_t>(out) % alignof(T) == 0) return reinterpret_cast<T*>(out);
  if (scratch->size() < count) scratch->resize(count);
  return scratch->data();
}

// Writes the values at the K indices already at the front of `out`.
void GatherValues(const float* in, size_t count, char* out) {
  char* values = out + 4 * count;
  for (size_t j = 0; j < count; ++j) StoreF32(values + 4 * j, in[LoadU32(out + 4 * j)]);
}

class Sparse : public Compressor {
 public:
  explicit Sparse(double k) : k_(k) {}

  size_t CompressedBytes(size_t n) const override { return 8 * SparseCount(k_, n); }

  void Decompress(const char* in, size_t n, float* out) const override {
    std::fill(out, out + n, 0.0f);
    DecompressAdd(in, n, out);
  }

  void DecompressAdd(const char* in, size_t n, float* out) const override {
    const size_t count = SparseCount(k_, n);
    const char* values = in + 4 * count;
    for (size_t j = 0; j < count; ++j) out[LoadU32(in + 4 * j)] += LoadF32(values + 4 * j);
  }

  bool Valid(const char* in, size_t n) const override {
    const size_t count = SparseCount(k_, n);
    for (size_t j = 0; j < count; ++j) {
      const uint32_t index = LoadU32(in + 4 * j);
      if (index >= n || (j > 0 && index <= LoadU32(in + 4 * (j - 1)))) return false;
    }
    return true;
  }

 protected:
  const double k_;
};

// ---------------------------------------------------------------------------
// topk

constexpr size_t kBlock = 256;  // Elements whose largest magnitude is checked at once.

inline uint32_t MagnitudeBits(float value) { return BitsOf(value) & 0x7fffffffu; }

// |x|'s bits above, the index's complement below: a larger key is a larger magnitude,
// or an equal one at a lower index.
inline uint64_t TopkKey(uint32_t magnitude_bits, size_t index) {
  return (static_cast<uint64_t>(magnitude_bits) << 32) | (0xffffffffu - index);
}

// Puts `key` in place of a min-heap's root and restores the heap.
void ReplaceRoot(uint64_t* heap, size_t count, uint64_t key) {
  size_t at = 0;
  for (;;) {
    size_t child = 2 * at + 1;
    if (child >= count) break;
    if (child + 1 < count && heap[child + 1] < heap[child]) ++child;
    if (heap[child] >= key) break;
    heap[at] = heap[child];
    at = child;
  }
  heap[at] = key;
}

// Few of many: a min-heap of the K largest keys so far. An element enters only with a
// magnitude above the root's (an equal one has a higher index than all the heap
// holds), and once the root is high most blocks have none. O(n) to scan, O(log K) per
// element that enters, O(K log K) to sort by index.
void TopkByHeap(const float* in, size_t n, size_t count, char* out) {
  thread_local std::vector<uint64_t> scratch;
  uint64_t* heap = WordsAt(out, count, &scratch);
  for (size_t i = 0; i < count; ++i) heap[i] = TopkKey(MagnitudeBits(in[i]), i);
  std::make_heap(heap, heap + count, std::greater<uint64_t>());
  uint32_t threshold = static_cast<uint32_t>(heap[0] >> 32);
  for (size_t i = count; i < n;) {
    const size_t end = std::min(n, i + kBlock);
    if (MaxMagnitudeBits(in + i, end - i) <= threshold) {
      i = end;
      continue;
    }
    for (; i < end; ++i) {
      const uint32_t bits = MagnitudeBits(in[i]);
      if (bits <= threshold) continue;
      ReplaceRoot(heap, count, TopkKey(bits, i));
      threshold = static_cast<uint32_t>(heap[0] >> 32);
    }
  }
  // By index, ascending (the complement, descending).
  std::sort(heap, heap + count, [](uint64_t a, uint64_t b) {
    return static_cast<uint32_t>(a) > static_cast<uint32_t>(b);
  });
  // Index j goes to bytes [4j, 4j + 4), inside key j / 2, which is read already.
  for (size_t j = 0; j < count; ++j) StoreU32(out + 4 * j, ~static_cast<uint32_t>(heap[j]));
  GatherValues(in, count, out);
}

// Counts, by their `width` bits below `shift`, the magnitudes whose bits from `shift`
// up are `prefix`. Four tables in turn, so that equal digits in a row (most, in a
// gradient) do not wait for each other's increments.
BPS_COMPRESSION_VECTORISE void CountDigits(const float* in, size_t n, int shift, uint32_t prefix,
                                           int width, uint32_t* counts) {
  const int below = shift - width;
  const uint32_t mask = (1u << width) - 1;
  uint32_t tables[4][2048] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) {
      const uint32_t bits = MagnitudeBits(in[i + j]);
      if ((bits >> shift) == prefix) ++tables[j][(bits >> below) & mask];
    }
  }
  for (; i < n; ++i) {
    const uint32_t bits = MagnitudeBits(in[i]);
    if ((bits >> shift) == prefix) ++tables[0][(bits >> below) & mask];
  }
  for (uint32_t digit = 0; digit <= mask; ++digit)
    counts[digit] = tables[0][digit] + tables[1][digit] + tables[2][digit] + tables[3][digit];
}

// Writes, in index order, the elements whose magnitude's bits from `shift` up are above
// `prefix`, and the first `ties` of those equal to it.
void TakeAbove(const float* in, size_t n, int shift, uint32_t prefix, size_t ties, size_t count,
               char* out) {
  const uint32_t lowest = prefix << shift;  // No smaller magnitude is taken.
  size_t taken = 0;
  for (size_t i = 0; i < n;) {
    const size_t end = std::min(n, i + kBlock);
    if (MaxMagnitudeBits(in + i, end - i) < lowest) {
      i = end;
      continue;
    }
    for (; i < end; ++i) {
      const uint32_t key = MagnitudeBits(in[i]) >> shift;
      if (key < prefix || (key == prefix && ties == 0)) continue;
      if (key == prefix) --ties;
      StoreU32(out + 4 * taken, static_cast<uint32_t>(i));
      StoreF32(out + 4 * (count + taken), in[i]);
      ++taken;
    }
  }
}

// Many of many: radix selection on the magnitudes' 31 bits, 11, 11 and 9 at a time.
// Each pass counts the candidates by their next digit and keeps the digit the K-th
// largest has; the last takes those above it and as many equal to it as are still
// needed, lowest index first. At most four passes over the input, already in index
// order: O(n) whatever K.
void TopkByRadix(const float* in, size_t n, size_t count, char* out) {
  int shift = 31;       // Candidates: magnitudes whose bits from `shift` up are `prefix`
  uint32_t prefix = 0;  // (all of them, to begin with).
  size_t needed = count;
  while (shift > 0) {
    const int width = shift > 11 ? 11 : shift;
    uint32_t counts[2048];
    CountDigits(in, n, shift, prefix, width, counts);
    uint32_t digit = (1u << width) - 1;
    for (; counts[digit] < needed; --digit) needed -= counts[digit];
    prefix = (prefix << width) | digit;
    shift -= width;
    if (counts[digit] == needed) break;  // All of these: no need to tell them apart.
  }
  TakeAbove(in, n, shift, prefix, needed, count, out);
}

class Topk final : public Sparse {
 public:
  using Sparse::Sparse;

  void Compress(const float* in, size_t n, uint64_t, uint32_t, char* out) const override {
    const size_t count = SparseCount(k_, n);
    if (count == n) {  // Everything, no choice to make.
      for (size_t i = 0; i < n; ++i) StoreU32(out + 4 * i, static_cast<uint32_t>(i));
      std::memcpy(out + 4 * n, in, 4 * n);
    } else if (count * kHeapBelow < n) {
      TopkByHeap(in, n, count, out);
    } else {
      TopkByRadix(in, n, count, out);
    }
  }

 private:
  // The heap for K below n / this: about where the two take as long (for 2^20 normal
  // elements, the heap is twice as fast for K = n / 1000, radix selection for n / 100).
  static constexpr size_t kHeapBelow = 256;
};

// ---------------------------------------------------------------------------
// randomk: Floyd's sampling. For j = n - K .. n - 1, draw t uniform in [0, j]
// (Random::Below(j + 1)) and take t, or j if t is taken already: every K-subset is
// equally likely, from K draws.

constexpr uint32_t kEmpty = 0xffffffffu;  // No index: a partition has fewer elements.

// Where `index` is in the open-addressing set `table` (`slots` of them, linear
// probing), or the empty slot where it would go.
inline size_t Slot(const uint32_t* table, size_t slots, uint32_t index) {
  size_t slot = static_cast<size_t>((static_cast<uint64_t>(index * 0x9E3779B1u) * slots) >> 32);
  while (table[slot] != kEmpty && table[slot] != index) slot = slot + 1 == slots ? 0 : slot + 1;
  return slot;
}

// Few of many: the taken indices in a hash set of 2K slots (half full at most), then
// sorted. O(K log K).
void SampleByHashing(Random* random, size_t n, size_t count, char* out) {
  const size_t slots = 2 * count;
  thread_local std::vector<uint32_t> scratch;
  uint32_t* table = WordsAt(out, slots, &scratch);
  std::fill(table, table + slots, kEmpty);
  for (size_t j = n - count; j < n; ++j) {
    const uint32_t drawn = static_cast<uint32_t>(random->Below(j + 1));
    const size_t slot = Slot(table, slots, drawn);
    if (table[slot] == drawn) {  // Taken: j is not (every index so far is below j).
      table[Slot(table, slots, static_cast<uint32_t>(j))] = static_cast<uint32_t>(j);
    } else {
      table[slot] = drawn;
    }
  }
  size_t kept = 0;
  for (size_t slot = 0; slot < slots; ++slot)
    if (table[slot] != kEmpty) table[kept++] = table[slot];
  std::sort(table, table + count);
  if (reinterpret_cast<char*>(table) != out) std::memcpy(out, table, 4 * count);
}

// Many of many: the taken indices as a bitmap of n bits in the output's upper half
// (it fits: 8 * ceil(n / 64) <= 4K bytes), read out in order into the lower half.
// O(K + n / 64).
void SampleByBitmap(Random* random, size_t n, size_t count, char* out) {
  const size_t words = (n + 63) / 64;
  unsigned char* bitmap = reinterpret_cast<unsigned char*>(out + 8 * count - 8 * words);
  std::memset(bitmap, 0, 8 * words);
  for (size_t j = n - count; j < n; ++j) {
    size_t taken = random->Below(j + 1);
    if (bitmap[taken >> 3] & (1u << (taken & 7))) taken = j;
    bitmap[taken >> 3] |= static_cast<unsigned char>(1u << (taken & 7));
  }
  size_t written = 0;
  for (size_t w = 0; w < words; ++w) {
    uint64_t word;  // Little-endian: bit b is index 64w + b.
    std::memcpy(&word, bitmap + 8 * w, 8);
    for (; word != 0; word &= word - 1)
      StoreU32(out + 4 * written++, static_cast<uint32_t>(64 * w + __builtin_ctzll(word)));
  }
}

class Randomk final : public Sparse {
 public:
  Randomk(double k, uint64_t seed) : Sparse(k), seed_(seed) {}

  void Compress(const float* in, size_t n, uint64_t stream, uint32_t round,
                char* out) const override {
    const size_t count = SparseCount(k_, n);
    if (count == 0) return;
    Random random(seed_, stream, round);
    if (8 * ((n + 63) / 64) <= 4 * count) {
      SampleByBitmap(&random, n, count, out);
    } else {
      SampleByHashing(&random, n, count, out);
    }
    GatherValues(in, count, out);
  }

 private:
  const uint64_t seed_;
};

}  // namespace

std::unique_ptr<Compressor> MakeTopk(const CompressorSpec& spec) {
  return std::make_unique<Topk>(spec.k);
}

std::unique_ptr<Compressor> MakeRandomk(const CompressorSpec& spec) {
  return std::make_unique<Randomk>(spec.k, spec.seed);
}

}  // namespace compression
}  // namespace bps
