// The workers an operation involves: the job's, or a process set's, which every
// server learns too; and Horovod's join, after which the others' rounds go on without
// this worker until every worker has joined.
#include <algorithm>
#include <chrono>

#include "worker.h"

namespace bps {

Group Worker::GlobalGroup() const {
  Group group;
  group.ranks.resize(options_.size);
  for (int r = 0; r < options_.size; ++r) group.ranks[r] = r;
  group.index = options_.rank;
  return group;
}

Status Worker::GroupOf(const Declaration& op, Group* group) {
  if (op.process_set == 0) {
    *group = GlobalGroup();
    return Status::OK();
  }
  {
    std::lock_guard<std::mutex> lock(process_sets_mutex_);
    auto found = process_sets_.find(op.process_set);
    if (found == process_sets_.end())
      return Status::Error(ErrorKind::kInvalidArgument,
                           "process set " + std::to_string(op.process_set) +
                               " is not registered (tensor '" + op.name + "')");
    group->ranks = found->second;
  }
  auto mine = std::find(group->ranks.begin(), group->ranks.end(), options_.rank);
  if (mine == group->ranks.end())
    return Status::Error(ErrorKind::kInvalidArgument, "rank " + std::to_string(options_.rank) +
                                                          " is not a member of process set " +
                                                          std::to_string(op.process_set) +
                                                          " (tensor '" + op.name + "')");
  group->index = static_cast<int>(mine - group->ranks.begin());
  return Status::OK();
}

Status Worker::SetProcessSet(uint32_t id, std::vector<int32_t> ranks) {
  if (id == 0) return Status::Error(ErrorKind::kInvalidArgument, "process set 0 is the global one");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= options_.size || (i > 0 && ranks[i] == ranks[i - 1]))
      return Status::Error(ErrorKind::kInvalidArgument, "process set " + std::to_string(id) +
                                                            " has an invalid or repeated rank " +
                                                            std::to_string(ranks[i]));
  }
  {
    std::lock_guard<std::mutex> lock(process_sets_mutex_);
    if (ranks.empty()) {
      process_sets_.erase(id);
    } else {
      process_sets_[id] = ranks;
    }
  }
  // Every server learns it before any push that names it (same connection, in order).
  for (auto& link : links_) link->SendProcessSet(id, ranks);
  return Status::OK();
}

Status Worker::Join(int* last_rank) {
  {
    std::lock_guard<std::mutex> lock(join_mutex_);
    join_replies_ = 0;
    join_last_ = -1;
    join_rounds_.clear();
  }
  if (local_) local_->BeginJoin();
  if (device_merge_) device_merge_->BeginJoin();
  int servers = 0;  // The job's: an elastic one may have gone on without some.
  for (size_t i = 0; i < links_.size(); ++i) {
    if (routes_.removed(static_cast<int>(i))) continue;
    links_[i]->SendJoin();
    ++servers;
  }
  std::unique_lock<std::mutex> lock(join_mutex_);
  const bool answered = join_cv_.wait_for(
      lock, std::chrono::milliseconds(options_.timeout_ms),
      [&] { return join_replies_ == servers || !fatal_error().ok() || stopping_; });
  Status fatal = fatal_error();
  if (!fatal.ok()) return fatal.WithSuffix(" (join)");
  if (stopping_) return Status::Error(ErrorKind::kShutdown, "tf_bps was shut down during join");
  if (!answered)
    return Status::Error(ErrorKind::kTimeout,
                         "join timed out after " + std::to_string(options_.timeout_ms / 1000) +
                             " s: not every worker joined (see BYTEPS_OP_TIMEOUT)");
  // Rounds that went on without this worker: catch up, so that its next operation on
  // those tensors meets the others' in the same round.
  {
    std::lock_guard<std::mutex> registry_lock(registry_mutex_);
    for (auto& [name, entry] : registry_) {
      auto found = join_rounds_.find(entry.id);
      if (found != join_rounds_.end()) entry.round = std::max(entry.round, found->second);
    }
    for (const auto& [tensor_id, round] : join_rounds_) {
      uint32_t& floor = round_floors_[tensor_id];
      floor = std::max(floor, round);
    }
  }
  if (local_) local_->EndJoin();
  if (device_merge_) device_merge_->EndJoin();
  *last_rank = join_last_;
  return Status::OK();
}

void Worker::OnJoined(int server, int last_rank,
                      const std::unordered_map<uint64_t, uint32_t>& rounds) {
  {
    std::lock_guard<std::mutex> lock(join_mutex_);
    // Servers may see joins in different orders; the first server's answer is the one
    // given (the first the job still has).
    int first = 0;
    while (routes_.removed(first)) ++first;
    if (server == first || join_last_ < 0) join_last_ = last_rank;
    for (const auto& [tensor_id, round] : rounds) {
      uint32_t& known = join_rounds_[tensor_id];
      known = std::max(known, round);
    }
    ++join_replies_;
  }
  join_cv_.notify_all();
}

}  // namespace bps
