// Push_pull (plain, compressed, asynchronous): every worker pushes every partition of
// the tensor, and each answer lands where its push was read from.
#include "../common/reduce.h"
#include "../compression/registry.h"
#include "op_policy.h"

namespace bps {
namespace {

class PushPull : public OpPolicy {
 public:
  Status Check(const TaskSpec& spec, const Group&) const override {
    const Declaration& op = spec.op;
    if (op.kind == OpKind::kAsyncPushPull) {
      if (!CanReduce(op.dtype))
        return InvalidRequest(op,
                              std::string(DataTypeName(op.dtype)) + " tensors cannot be summed");
      if (op.reduce_op != ReduceOp::kSum)
        return InvalidRequest(op,
                              "an asynchronous update adds weight deltas; it takes no reduce op");
      if (op.process_set != 0)
        return InvalidRequest(op, "asynchronous training spans every worker, not a process set");
    }
    const CompressionSetup* setup = nullptr;
    if (op.compression.empty() || !FindCompression(op.compression, &setup).ok() ||
        !setup->compressor)
      return Status::OK();
    // What the compressors and the servers' sums are defined for (as in BytePS).
    if (op.dtype != DataType::kFloat32)
      return InvalidRequest(op, "'" + setup->text + "' compresses float32 tensors, not " +
                                    DataTypeName(op.dtype));
    if (op.reduce_op != ReduceOp::kSum && op.reduce_op != ReduceOp::kAverage)
      return InvalidRequest(op, "'" + setup->text + "' compresses sums and averages, not " +
                                    ReduceOpName(op.reduce_op));
    if (op.process_set != 0)
      return InvalidRequest(op, "'" + setup->text +
                                    "' compresses in the global set only, not in process set " +
                                    std::to_string(op.process_set));
    return Status::OK();
  }

  bool OutputIsInputSized() const override { return true; }

  size_t PieceBytes(const TaskSpec& spec, const PlanSetup& setup) const override {
    return EvenPartitionBytes(spec.bytes, DataTypeSize(spec.op.dtype), setup.partition_bytes,
                              setup.spread, setup.across_hosts);
  }

  Status Plan(const std::shared_ptr<Task>& task, const PlanSetup& setup,
              std::vector<PartitionTask>* plan) const override {
    const TaskSpec& spec = task->spec();
    const char* source = task->source();
    const size_t partition = PieceBytes(spec, setup);
    for (size_t offset = 0; offset < spec.bytes; offset += partition) {
      const size_t length = std::min(partition, spec.bytes - offset);
      plan->push_back(MakePartition(task, static_cast<uint32_t>(plan->size()), offset,
                                    source + offset, length, length));
    }
    return Status::OK();
  }
};

}  // namespace

const OpPolicy& PushPullPolicy() {
  static const PushPull policy;
  return policy;
}

}  // namespace bps
