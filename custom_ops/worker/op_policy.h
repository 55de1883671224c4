// What a worker does for one operation kind: the kind's own checks of a request, how
// its task is cut into partitions, and, for the gathers, how the rows follow once the
// servers have told every worker's sizes. One policy per kind, each in its own file
// (reduce_op.cc, broadcast_op.cc, scatter_op.cc, gather_op.cc), as the servers have
// theirs (rounds/policy.h). The worker runs what every kind shares: the common checks,
// the prescale, the dispatch of the partitions.
#ifndef TF_BPS_WORKER_OP_POLICY_H_
#define TF_BPS_WORKER_OP_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../common/common.h"
#include "task.h"

namespace bps {

// What planning needs to know of the worker and its job.
struct PlanSetup {
  int rank = 0;                // this worker's, in the whole job
  size_t partition_bytes = 0;  // BYTEPS_PARTITION_BYTES
  size_t spread = 1;           // the length of the servers' cycle (ServerCycle)
  bool across_hosts = false;   // partitions are cut for a network (EvenPartitionBytes)
};

class OpPolicy {
 public:
  virtual ~OpPolicy() = default;
  // The kind's own mistakes in a request, after the checks every kind shares.
  virtual Status Check(const TaskSpec& spec, const Group& group) const = 0;
  // Whether the output has the input's size, so that the adapter gives it; otherwise
  // the task asks for it (Task::AllocateOutput) once its size is known.
  virtual bool OutputIsInputSized() const = 0;
  // The bytes of the pieces the input is cut into: the partitions, where they are even.
  virtual size_t PieceBytes(const TaskSpec& spec, const PlanSetup& setup) const;
  // Cuts `task` into its partitions (a gather: its sizes step only), reading its
  // pushes from task->source().
  virtual Status Plan(const std::shared_ptr<Task>& task, const PlanSetup& setup,
                      std::vector<PartitionTask>* plan) const = 0;
  // A gather's rows, once the servers told every worker's: `table` holds each
  // worker's row count, then (alltoall) the matrix of splits, checked for size and range.
  virtual Status PlanRows(const std::shared_ptr<Task>& task, const std::vector<int64_t>& table,
                          const PlanSetup& setup, std::vector<PartitionTask>* plan) const;
};

// Each kind's policy, named in its row of op_kinds.def: PushPullPolicy (push_pull,
// compressed and asynchronous: every partition from every worker), BroadcastOpPolicy
// (the root's partitions cross once; the others only receive), ReduceScatterPolicy (a
// reduction whose partitions each go back to one rank), AllgatherPolicy and
// AlltoallPolicy (the sizes first, then the rows).
#define BPS_OP_KIND(name, c_name, value, text, worker_policy, server_policy) \
  const OpPolicy& worker_policy();
#include "../wire/op_kinds.def"
#undef BPS_OP_KIND

const OpPolicy& OpPolicyFor(OpKind kind);

// Shared by the policies: an adapter's mistake in `op`, naming the kind and tensor.
Status InvalidRequest(const Declaration& op, const std::string& why);
// The kinds that split or concatenate along the first dimension refuse a scalar.
Status CheckHasRows(const Declaration& op);
// Whole elements of at most BYTEPS_PARTITION_BYTES.
size_t ElementPartitionBytes(DataType dtype, size_t partition_bytes);
// The bytes of one row (all dimensions but the first).
size_t RowBytes(const Declaration& op);

}  // namespace bps

#endif  // TF_BPS_WORKER_OP_POLICY_H_
