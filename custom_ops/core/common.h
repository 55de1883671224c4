// Types shared by every layer of the core: data types, tensor views, status.
#ifndef TF_BPS_CORE_COMMON_H_
#define TF_BPS_CORE_COMMON_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace bps {

// Wire values: they travel in frame headers, so never renumber them.
enum class DataType : uint8_t {
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat32 = 3,
  kFloat64 = 4,
  kInt32 = 5,
  kInt64 = 6,
};

size_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
bool IsValidDataType(uint8_t value);

enum class ReduceOp : uint8_t { kSum = 0, kAverage = 1 };

// A result that either succeeded or carries a message meant for the user.
class Status {
 public:
  static Status OK() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }
  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  Status() = default;
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::string message_;
};

using DoneCallback = std::function<void(const Status&)>;

// What a framework adapter hands to the core: borrowed memory plus metadata.
// `input` must stay valid and unchanged, and `output` writable, until `done` runs.
// `input` and `output` may alias (the op then works in place).
struct TensorView {
  DataType dtype;
  std::vector<int64_t> shape;
  const void* input;
  void* output;
  size_t bytes;
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

#endif  // TF_BPS_CORE_COMMON_H_
