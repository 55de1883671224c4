#include "op_policy.h"

#include <algorithm>

namespace bps {

size_t OpPolicy::PieceBytes(const TaskSpec& spec, const PlanSetup& setup) const {
  return ElementPartitionBytes(spec.op.dtype, setup.partition_bytes);
}

Status OpPolicy::PlanRows(const std::shared_ptr<Task>& task, const std::vector<int64_t>&,
                          const PlanSetup&, std::vector<PartitionTask>*) const {
  return Status::Error(ErrorKind::kInternal,
                       std::string(OpKindName(task->kind())) + " of tensor '" + task->name() +
                           "' has no rows to follow its sizes");
}

Status InvalidRequest(const Declaration& op, const std::string& why) {
  return Status::Error(ErrorKind::kInvalidArgument,
                       std::string(OpKindName(op.kind)) + " of tensor '" + op.name + "': " + why);
}

Status CheckHasRows(const Declaration& op) {
  if (!op.shape.empty()) return Status::OK();
  return InvalidRequest(op, "a scalar has no first dimension to split or concatenate along");
}

size_t ElementPartitionBytes(DataType dtype, size_t partition_bytes) {
  // Partitions hold whole elements so that servers and averaging never split one.
  const size_t element = DataTypeSize(dtype);
  return std::max(element, partition_bytes / element * element);
}

size_t RowBytes(const Declaration& op) {
  size_t row_bytes = DataTypeSize(op.dtype);
  for (size_t i = 1; i < op.shape.size(); ++i) row_bytes *= static_cast<size_t>(op.shape[i]);
  return row_bytes;
}

const OpPolicy& OpPolicyFor(OpKind kind) {
  switch (kind) {
#define BPS_OP_KIND(name, c_name, value, text, worker_policy, server_policy) \
  case OpKind::k##name:                                                       \
    return worker_policy();
#include "../wire/op_kinds.def"
#undef BPS_OP_KIND
  }
  // Only a byte that IsValidOpKind refused could get here, and none is let in.
  return PushPullPolicy();
}

}  // namespace bps
