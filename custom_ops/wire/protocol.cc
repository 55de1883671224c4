#include "protocol.h"

#include <cstring>
#include <sstream>

namespace bps {
namespace {

// Bounds on a declaration from the wire, checked before anything is allocated.
constexpr uint32_t kMaxNameBytes = 64 * 1024;
constexpr uint32_t kMaxDims = 64;
constexpr uint32_t kMaxCompressionBytes = 1024;

class Writer {
 public:
  template <typename T>
  void Put(const T& value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  void PutBytes(const void* data, size_t bytes) {
    out_.append(static_cast<const char*>(data), bytes);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <typename T>
  bool Get(T* value) {
    return GetBytes(value, sizeof(*value));
  }
  bool GetBytes(void* dst, size_t bytes) {
    if (bytes > in_.size() - pos_) return false;
    if (bytes) std::memcpy(dst, in_.data() + pos_, bytes);  // An empty vector's data() is null.
    pos_ += bytes;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace

const char* OpKindName(OpKind kind) {
  switch (kind) {
#define BPS_OP_KIND(name, c_name, value, text, worker_policy, server_policy) \
  case OpKind::k##name:                                                       \
    return text;
#include "op_kinds.def"
#undef BPS_OP_KIND
  }
  return "unknown operation";
}

bool IsValidOpKind(uint8_t byte) {
  switch (byte) {
#define BPS_OP_KIND(name, c_name, value, text, worker_policy, server_policy) case value:
#include "op_kinds.def"
#undef BPS_OP_KIND
    return true;
  }
  return false;
}

std::string EncodeDeclaration(const Declaration& d) {
  Writer out;
  out.Put(static_cast<uint32_t>(d.name.size()));
  out.PutBytes(d.name.data(), d.name.size());
  out.Put(static_cast<uint8_t>(d.kind));
  out.Put(static_cast<uint8_t>(d.dtype));
  out.Put(static_cast<uint8_t>(d.reduce_op));
  out.Put(d.root_rank);
  out.Put(d.prescale);
  out.Put(d.postscale);
  out.Put(d.process_set);
  out.Put(static_cast<uint32_t>(d.shape.size()));
  out.PutBytes(d.shape.data(), d.shape.size() * sizeof(int64_t));
  out.Put(static_cast<uint32_t>(d.compression.size()));
  out.PutBytes(d.compression.data(), d.compression.size());
  return out.Take();
}

bool DecodeDeclaration(const std::string& payload, Declaration* d) {
  Reader in(payload);
  uint32_t name_bytes = 0, dims = 0;
  uint8_t kind = 0, dtype = 0, reduce_op = 0;
  if (!in.Get(&name_bytes) || name_bytes > kMaxNameBytes) return false;
  d->name.resize(name_bytes);
  if (!in.GetBytes(d->name.data(), name_bytes) || !in.Get(&kind) || !IsValidOpKind(kind) ||
      !in.Get(&dtype) || !IsValidDataType(dtype) || !in.Get(&reduce_op) ||
      !IsValidReduceOp(reduce_op) || !in.Get(&d->root_rank) || !in.Get(&d->prescale) ||
      !in.Get(&d->postscale) || !in.Get(&d->process_set) || !in.Get(&dims) || dims > kMaxDims)
    return false;
  d->kind = static_cast<OpKind>(kind);
  d->dtype = static_cast<DataType>(dtype);
  d->reduce_op = static_cast<ReduceOp>(reduce_op);
  d->shape.resize(dims);
  uint32_t compression_bytes = 0;
  if (!in.GetBytes(d->shape.data(), dims * sizeof(int64_t)) || !in.Get(&compression_bytes) ||
      compression_bytes > kMaxCompressionBytes)
    return false;
  d->compression.resize(compression_bytes);
  return in.GetBytes(d->compression.data(), compression_bytes) && in.done();
}

uint64_t DeclaredBytes(const Declaration& d) {
  uint64_t bytes = DataTypeSize(d.dtype);
  for (int64_t dim : d.shape) {
    if (dim < 0 || (dim > 0 && bytes > UINT64_MAX / static_cast<uint64_t>(dim))) return UINT64_MAX;
    bytes *= static_cast<uint64_t>(dim);
  }
  return bytes;
}

uint64_t Signature(const Declaration& d) {
  Declaration agreed = d;
  agreed.name.clear();
  // Gathers concatenate along the first axis, whose length may differ by worker.
  if (IsGather(d.kind) && !agreed.shape.empty()) agreed.shape[0] = 0;
  if (d.kind != OpKind::kBroadcast) agreed.root_rank = 0;
  const std::string bytes = EncodeDeclaration(agreed);
  return StableHash(bytes.data(), bytes.size());
}

std::string Describe(const Declaration& d) {
  std::ostringstream out;
  out << OpKindName(d.kind);
  if (IsReduction(d.kind)) out << "(" << ReduceOpName(d.reduce_op) << ")";
  if (d.kind == OpKind::kBroadcast) out << " from rank " << d.root_rank;
  out << " of " << ShapeString(d.dtype, d.shape);
  if (d.prescale != 1.0) out << " prescaled by " << d.prescale;
  if (d.postscale != 1.0) out << " postscaled by " << d.postscale;
  if (d.process_set != 0) out << " in process set " << d.process_set;
  if (!d.compression.empty()) out << " compressed with '" << d.compression << "'";
  return out.str();
}

uint64_t StableHash(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t hash = seed;
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 1099511628211ULL;
  }
  return hash;
}

std::string MismatchText(const Declaration& a, uint32_t rank_a, const Declaration& b,
                         uint32_t rank_b) {
  return "tensor '" + a.name + "' does not match across workers: rank " + std::to_string(rank_a) +
         " sent " + Describe(a) + ", rank " + std::to_string(rank_b) + " sent " + Describe(b);
}

}  // namespace bps
