// Broadcast: the root's partitions cross once, and every other worker only receives.
#include <cstring>

#include "op_policy.h"

namespace bps {
namespace {

class Broadcast : public OpPolicy {
 public:
  Status Check(const TaskSpec& spec, const Group& group) const override {
    const Declaration& op = spec.op;
    if (group.Contains(op.root_rank)) return Status::OK();
    const std::string job = "a rank of this job (size " + std::to_string(group.size()) + ")";
    return InvalidRequest(op, "root rank " + std::to_string(op.root_rank) + " is not " +
                                  (op.process_set
                                       ? "in process set " + std::to_string(op.process_set)
                                       : job));
  }

  bool OutputIsInputSized() const override { return true; }

  size_t PieceBytes(const TaskSpec& spec, const PlanSetup& setup) const override {
    return PushPullPolicy().PieceBytes(spec, setup);
  }

  Status Plan(const std::shared_ptr<Task>& task, const PlanSetup& setup,
              std::vector<PartitionTask>* plan) const override {
    const TaskSpec& spec = task->spec();
    const bool root = spec.op.root_rank == setup.rank;
    if (root && spec.output != spec.input)
      std::memcpy(spec.output, spec.input, spec.bytes);
    const char* source = task->source();
    const size_t partition = PieceBytes(spec, setup);
    for (size_t offset = 0; offset < spec.bytes; offset += partition) {
      const size_t length = std::min(partition, spec.bytes - offset);
      plan->push_back(MakePartition(task, static_cast<uint32_t>(plan->size()), offset,
                                    source + offset, root ? length : 0, root ? 0 : length));
    }
    return Status::OK();
  }
};

}  // namespace

const OpPolicy& BroadcastOpPolicy() {
  static const Broadcast policy;
  return policy;
}

}  // namespace bps
