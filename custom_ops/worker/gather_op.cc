// Allgather and alltoall, in two steps: first every worker's sizes (one partition,
// kSizesPart), then, once the servers told them, the rows, each partition landing at
// its place in the output.
#include <cstring>

#include "op_policy.h"

namespace bps {
namespace {

class Gather : public OpPolicy {
 public:
  Status Check(const TaskSpec& spec, const Group&) const override {
    return CheckHasRows(spec.op);
  }

  bool OutputIsInputSized() const override { return false; }

  // The sizes step: an alltoall pushes its splits, an allgather nothing; the reply is
  // every worker's row count, then (alltoall) every worker's splits.
  Status Plan(const std::shared_ptr<Task>& task, const PlanSetup&,
              std::vector<PartitionTask>* plan) const override {
    const int size = task->group().size();
    const bool alltoall = task->kind() == OpKind::kAlltoall;
    const size_t sizes_bytes = alltoall ? size * size * sizeof(int64_t) : 0;
    const char* splits = reinterpret_cast<const char*>(task->splits().data());
    plan->push_back(MakePartition(task, kSizesPart, 0, splits,
                                  alltoall ? size * sizeof(int64_t) : 0,
                                  AllgatherTableBytes(size) + sizes_bytes));
    return Status::OK();
  }
};

class Allgather : public Gather {
 public:
  // Each worker's rows are cut into partitions of their own, in the result's order: a
  // partition has one sender (the others push nothing), so the server passes it on as
  // it came, and each reply lands at its place in the output.
  Status PlanRows(const std::shared_ptr<Task>& task, const std::vector<int64_t>& table,
                  const PlanSetup& setup, std::vector<PartitionTask>* plan) const override {
    const Group& group = task->group();
    const size_t row_bytes = RowBytes(task->op());
    std::vector<int64_t> out_shape = task->op().shape;
    out_shape[0] = 0;
    for (int r = 0; r < group.size(); ++r) out_shape[0] += table[r];
    Status status = task->AllocateOutput(out_shape);
    if (!status.ok()) return status;
    const size_t partition = std::max<size_t>(1, setup.partition_bytes);
    size_t offset = 0;
    for (int r = 0; r < group.size(); ++r) {
      const size_t bytes = static_cast<size_t>(table[r]) * row_bytes;
      for (size_t at = 0; at < bytes; at += partition) {
        const size_t length = std::min(partition, bytes - at);
        plan->push_back(MakePartition(task, static_cast<uint32_t>(plan->size()) + 1, offset + at,
                                      task->source() + at, r == group.index ? length : 0,
                                      length));
      }
      offset += bytes;
    }
    return Status::OK();
  }
};

class Alltoall : public Gather {
 public:
  Status Check(const TaskSpec& spec, const Group& group) const override {
    Status status = Gather::Check(spec, group);
    if (!status.ok()) return status;
    const Declaration& op = spec.op;
    const int size = group.size();
    if (spec.splits.empty()) {
      if (op.shape[0] % size == 0) return Status::OK();
      return InvalidRequest(op, "without splits the first dimension (" +
                                    std::to_string(op.shape[0]) + ") must divide evenly among " +
                                    std::to_string(size) + " workers");
    }
    if (spec.splits.size() != static_cast<size_t>(size))
      return InvalidRequest(op, std::to_string(spec.splits.size()) + " splits for " +
                                    std::to_string(size) + " workers");
    int64_t rows = 0;
    for (int64_t split : spec.splits) {
      if (split < 0) return InvalidRequest(op, "a negative split");
      rows += split;
    }
    if (rows != op.shape[0])
      return InvalidRequest(op, "the splits add up to " + std::to_string(rows) +
                                    " rows, the tensor has " + std::to_string(op.shape[0]));
    return Status::OK();
  }

  // One partition per receiving rank: it gathers every sender's rows for that rank.
  // Row r of the table's matrix holds what rank r sends to each rank.
  Status PlanRows(const std::shared_ptr<Task>& task, const std::vector<int64_t>& table,
                  const PlanSetup&, std::vector<PartitionTask>* plan) const override {
    const Group& group = task->group();
    const int size = group.size(), rank = group.index;
    const size_t row_bytes = RowBytes(task->op());
    const int64_t* matrix = table.data() + size;
    std::vector<int64_t> received(size);
    int64_t total = 0;
    for (int r = 0; r < size; ++r) {
      received[r] = matrix[r * size + rank];
      total += received[r];
    }
    std::vector<int64_t> out_shape = task->op().shape;
    out_shape[0] = total;
    Status status = task->AllocateOutput(out_shape);
    if (status.ok()) status = task->SetReceivedSplits(received);
    if (!status.ok()) return status;
    size_t offset = 0;
    for (int owner = 0; owner < size; ++owner) {
      const size_t length = static_cast<size_t>(task->splits()[owner]) * row_bytes;
      PartitionTask item =
          MakePartition(task, static_cast<uint32_t>(owner) + 1, 0, task->source() + offset,
                        length, owner == rank ? static_cast<size_t>(total) * row_bytes : 0);
      item.owner = group.ranks[owner];
      plan->push_back(std::move(item));
      offset += length;
    }
    return Status::OK();
  }
};

}  // namespace

const OpPolicy& AllgatherPolicy() {
  static const Allgather policy;
  return policy;
}

const OpPolicy& AlltoallPolicy() {
  static const Alltoall policy;
  return policy;
}

}  // namespace bps
