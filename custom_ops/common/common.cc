#include "common.h"

#include <sstream>

namespace bps {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUint8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kUint16:
    case DataType::kInt16:
      return 2;
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUint8:
      return "uint8";
    case DataType::kInt8:
      return "int8";
    case DataType::kUint16:
      return "uint16";
    case DataType::kInt16:
      return "int16";
    case DataType::kBool:
      return "bool";
  }
  return "unknown";
}

bool IsValidDataType(uint8_t value) { return value >= 1 && value <= 11; }

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
  }
  return "unknown";
}

bool IsValidReduceOp(uint8_t value) { return value <= 4; }

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kOk:
      return "ok";
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kMismatch:
      return "mismatch";
    case ErrorKind::kPeerGone:
      return "peer gone";
    case ErrorKind::kAborted:
      return "aborted";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kInternal:
      return "internal";
    case ErrorKind::kShutdown:
      return "shut down";
  }
  return "unknown";
}

std::string ShapeString(DataType dtype, const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << DataTypeName(dtype) << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
  out << "]";
  return out.str();
}

}  // namespace bps
