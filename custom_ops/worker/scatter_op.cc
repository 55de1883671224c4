// Reducescatter: a reduction whose partitions each go back to the one rank whose rows
// they hold; partitions never straddle two ranks' rows.
#include "op_policy.h"

namespace bps {
namespace {

class ReduceScatter : public OpPolicy {
 public:
  Status Check(const TaskSpec& spec, const Group&) const override {
    return CheckHasRows(spec.op);
  }

  bool OutputIsInputSized() const override { return false; }

  Status Plan(const std::shared_ptr<Task>& task, const PlanSetup& setup,
              std::vector<PartitionTask>* plan) const override {
    const Declaration& op = task->op();
    const Group& group = task->group();
    const int size = group.size();
    const size_t partition = ElementPartitionBytes(op.dtype, setup.partition_bytes);
    const size_t row_bytes = RowBytes(op);
    std::vector<int64_t> mine = op.shape;
    mine[0] = ScatterRows(op.shape[0], group.index, size);
    Status status = task->AllocateOutput(mine);
    if (!status.ok()) return status;
    const char* source = task->source();
    for (int owner = 0; owner < size; ++owner) {
      const size_t begin = ScatterFirstRow(op.shape[0], owner, size) * row_bytes;
      const size_t end = begin + ScatterRows(op.shape[0], owner, size) * row_bytes;
      for (size_t offset = begin; offset < end; offset += partition) {
        const size_t length = std::min(partition, end - offset);
        PartitionTask item =
            MakePartition(task, static_cast<uint32_t>(plan->size()), offset - begin,
                          source + offset, length, owner == group.index ? length : 0);
        item.owner = group.ranks[owner];
        plan->push_back(std::move(item));
      }
    }
    return Status::OK();
  }
};

}  // namespace

const OpPolicy& ReduceScatterPolicy() {
  static const ReduceScatter policy;
  return policy;
}

}  // namespace bps
