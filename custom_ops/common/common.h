// Types shared by every layer of the core: data types, tensor views, status.
#ifndef TF_BPS_COMMON_COMMON_H_
#define TF_BPS_COMMON_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bps {

// tf_bps's version (tf_bps/__init__.py's __version__; tests/test_job.py keeps
// the two equal).
constexpr char kVersion[] = "0.1.0";

// Wire values: they travel in frame headers, so never renumber them.
enum class DataType : uint8_t {
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat32 = 3,
  kFloat64 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kUint8 = 7,
  kInt8 = 8,
  kUint16 = 9,
  kInt16 = 10,
  kBool = 11,  // One byte per element, 0 or 1.
};

size_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
bool IsValidDataType(uint8_t value);

// Wire values too. Average is a sum on the servers, divided by the size on the worker.
enum class ReduceOp : uint8_t { kSum = 0, kAverage = 1, kMin = 2, kMax = 3, kProduct = 4 };

const char* ReduceOpName(ReduceOp op);
bool IsValidReduceOp(uint8_t value);

// Why an operation failed, so that adapters can raise the matching error class
// (TensorFlow: InvalidArgument, FailedPrecondition, Unavailable, Aborted, ...).
// Wire values: servers send them in error frames.
enum class ErrorKind : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,  // The caller's input is unusable.
  kMismatch = 2,         // Workers disagree on a tensor's shape, dtype, root, op, ...
  kPeerGone = 3,         // A server or worker died or closed its connection.
  kAborted = 4,          // The round was abandoned (another worker failed, stale round).
  kTimeout = 5,          // BYTEPS_OP_TIMEOUT passed.
  kInternal = 6,         // A bug or a malformed peer.
  kShutdown = 7,         // tf_bps is not initialised or was shut down.
};

const char* ErrorKindName(ErrorKind kind);

// A result that either succeeded or carries a kind and a message meant for the user.
class Status {
 public:
  static Status OK() { return Status(); }
  static Status Error(std::string message) {
    return Error(ErrorKind::kInternal, std::move(message));
  }
  static Status Error(ErrorKind kind, std::string message) {
    return Status(kind == ErrorKind::kOk ? ErrorKind::kInternal : kind, std::move(message));
  }
  bool ok() const { return kind_ == ErrorKind::kOk; }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  // The same kind, the message extended (say, with the tensor's name).
  Status WithSuffix(const std::string& suffix) const { return Status(kind_, message_ + suffix); }

 private:
  Status() = default;
  Status(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}
  ErrorKind kind_ = ErrorKind::kOk;
  std::string message_;
};

// One partition of one tensor: what a server sums and a worker waits for.
struct PartitionKey {
  uint64_t tensor_id;
  uint32_t part;
  bool operator==(const PartitionKey& other) const {
    return tensor_id == other.tensor_id && part == other.part;
  }
};

struct PartitionKeyHash {
  size_t operator()(const PartitionKey& key) const {
    return static_cast<size_t>(key.tensor_id ^ (key.part * 0x9E3779B97F4A7C15ULL));
  }
};

std::string ShapeString(DataType dtype, const std::vector<int64_t>& shape);

}  // namespace bps

#endif  // TF_BPS_COMMON_COMMON_H_
