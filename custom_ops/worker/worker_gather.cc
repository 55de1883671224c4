// A gather's second step (allgather, alltoall): once every worker's row counts are
// known from the servers' answer to the sizes partition, the output is allocated and
// the rows are cut into partitions of their own, each landing at its place.
#include <algorithm>
#include <cstring>

#include "worker.h"

namespace bps {

size_t Worker::RowBytes(const Declaration& op) {
  size_t row_bytes = DataTypeSize(op.dtype);
  for (size_t i = 1; i < op.shape.size(); ++i) row_bytes *= static_cast<size_t>(op.shape[i]);
  return row_bytes;
}

Status Worker::StartGatherData(const std::shared_ptr<Task>& task, const std::vector<char>& sizes) {
  const TaskSpec& spec = task->spec();
  const Group& group = task->group();
  // Positions in the group (a process set), not global ranks.
  const int size = group.size(), rank = group.index;
  const size_t row_bytes = RowBytes(spec.op);
  // The reply: each worker's `rows`, then (alltoall) each worker's splits.
  std::vector<int64_t> table(sizes.size() / sizeof(int64_t));
  std::memcpy(table.data(), sizes.data(), table.size() * sizeof(int64_t));
  auto bad = [&](const std::string& what) {
    return Status::Error(ErrorKind::kInternal, "a server sent " + what + " in " +
                                                   OpKindName(spec.op.kind) + " of tensor '" +
                                                   spec.op.name + "'");
  };
  for (int64_t count : table) {
    // Bounded so that the sums below cannot overflow whatever a server sends.
    if (count < 0 || count > (int64_t{1} << 40))
      return bad("a row count of " + std::to_string(count));
  }
  if (table[rank] != spec.op.shape[0]) return bad("another row count for this worker");
  std::vector<int64_t> out_shape = spec.op.shape;
  if (spec.op.kind == OpKind::kAllgather) {
    int64_t total = 0;
    for (int r = 0; r < size; ++r) total += table[r];
    out_shape[0] = total;
    Status status = task->AllocateOutput(out_shape);
    if (!status.ok()) return status;
    // Each worker's rows are cut into partitions of their own, in the result's
    // order: a partition has one sender (the others push nothing), so the server
    // passes it on as it came, and each reply lands at its place in the output.
    const size_t partition = std::max<size_t>(1, options_.partition_bytes);
    std::vector<PartitionTask> plan;
    size_t offset = 0;
    for (int r = 0; r < size; ++r) {
      const size_t bytes = static_cast<size_t>(table[r]) * row_bytes;
      for (size_t at = 0; at < bytes; at += partition) {
        const size_t length = std::min(partition, bytes - at);
        plan.push_back(MakePartition(task, static_cast<uint32_t>(plan.size()) + 1, offset + at,
                                     task->source() + at, r == rank ? length : 0, length));
      }
      offset += bytes;
    }
    task->AddPartitions(static_cast<int>(plan.size()));
    for (PartitionTask& item : plan) Dispatch(std::move(item), false);
    return Status::OK();
  }
  // Alltoall: row r of the matrix holds what rank r sends to each rank.
  const int64_t* matrix = table.data() + size;
  if (table.size() != static_cast<size_t>(size + size * size))
    return bad("a malformed split table");
  std::vector<int64_t> received(size);
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    received[r] = matrix[r * size + rank];
    if (received[r] < 0 || received[r] > (int64_t{1} << 40)) return bad("a negative split");
    total += received[r];
  }
  out_shape[0] = total;
  Status status = task->AllocateOutput(out_shape);
  if (status.ok()) status = task->SetReceivedSplits(received);
  if (!status.ok()) return status;
  // One partition per receiving rank: it gathers every sender's rows for that rank.
  std::vector<PartitionTask> plan;
  size_t offset = 0;
  for (int owner = 0; owner < size; ++owner) {
    const size_t length = static_cast<size_t>(task->splits()[owner]) * row_bytes;
    PartitionTask item =
        MakePartition(task, static_cast<uint32_t>(owner) + 1, 0, task->source() + offset, length,
                      owner == rank ? static_cast<size_t>(total) * row_bytes : 0);
    item.owner = group.ranks[owner];
    plan.push_back(std::move(item));
    offset += length;
  }
  task->AddPartitions(static_cast<int>(plan.size()));
  for (PartitionTask& item : plan) Dispatch(std::move(item), false);
  return Status::OK();
}

}  // namespace bps
