// A worker losing a server: a job that cannot go on without it fails; an elastic,
// synchronous one keeps the server's partitions until the scheduler says the server
// is gone from the job, then sends them to the servers left (worker.h).
//
// Nothing is restored and no step is lost: a server holds only the rounds in flight,
// and every worker still holds what it pushed there until the answer comes. The
// servers that take over see those rounds as new ones (rounds/round.h opens a key at
// whatever round first reaches it), and each worker's contribution arrives again.
#include <unistd.h>

#include "../common/logging.h"
#include "worker.h"

namespace bps {

bool Worker::OnServerLost(int server) {
  {
    std::lock_guard<std::mutex> lock(lost_mutex_);
    for (const LostServer& known : lost_)
      if (known.server == server) return options_.move_lost_servers;
    lost_.push_back({server, std::chrono::steady_clock::now()});
  }
  if (options_.notify_fd >= 0) {
    const char byte = 1;
    // Non-blocking: a full pipe already has a wake-up in it.
    if (write(options_.notify_fd, &byte, 1) < 0) BPS_LOG(kDebug) << "lost-server notice not sent";
  }
  if (options_.move_lost_servers)
    BPS_LOG(kWarning) << links_[server]->description()
                      << " went away; its partitions wait for the scheduler to move them";
  return options_.move_lost_servers;
}

std::vector<int> Worker::lost_servers() const {
  std::lock_guard<std::mutex> lock(lost_mutex_);
  std::vector<int> servers;
  for (const LostServer& lost : lost_) servers.push_back(lost.server);
  return servers;
}

Status Worker::MoveLostServer(int server) {
  if (!options_.move_lost_servers)
    return Status::Error(ErrorKind::kInvalidArgument,
                         "this worker fails with its servers; it does not move their partitions");
  if (routes_.removed(server)) return Status::OK();
  Status status = routes_.Remove(server);
  if (!status.ok()) return status;
  {
    std::lock_guard<std::mutex> lock(lost_mutex_);
    bool known = false;
    for (LostServer& lost : lost_) {
      if (lost.server != server) continue;
      lost.moved = known = true;
    }
    // Another worker saw it go (this one had nothing in flight there, or a frozen
    // server still holds this worker's connection open).
    if (!known) lost_.push_back({server, std::chrono::steady_clock::now(), true});
  }
  // The routes first: a partition arriving at the retired link now goes round it.
  const std::string lost = links_[server]->description();
  std::vector<PendingPartition> waiting = links_[server]->Retire();
  BPS_LOG(kWarning) << lost << " is gone from the job: its partitions go to the servers left ("
                    << waiting.size() << " in flight sent again)";
  for (PendingPartition& partition : waiting) SendAgain(std::move(partition), lost);
  return Status::OK();
}

void Worker::SendAgain(PendingPartition partition, const std::string& lost) {
  const Task& task = *partition.task;
  if (!IsPushPull(task.kind()) && task.kind() != OpKind::kBroadcast) {
    // A gather's second step depends on the sizes its first got from that server.
    partition.task->Fail(Status::Error(
        ErrorKind::kPeerGone, std::string(OpKindName(task.kind())) + " of tensor '" + task.name() +
                                  "' (round " + std::to_string(task.round()) +
                                  ") was in flight at " + lost +
                                  ", which the job lost; only push_pull and broadcast rounds "
                                  "move to another server"));
    return;
  }
  partition.queued_at = 0;
  SendToServer(std::move(partition));
}

void Worker::CheckLostServers(std::chrono::steady_clock::time_point now) {
  if (!options_.move_lost_servers || !fatal_error().ok()) return;
  std::string overdue;
  {
    std::lock_guard<std::mutex> lock(lost_mutex_);
    for (const LostServer& lost : lost_) {
      if (lost.moved || now - lost.at < std::chrono::milliseconds(options_.lost_server_wait_ms))
        continue;
      overdue = links_[lost.server]->description();
      break;
    }
  }
  if (overdue.empty()) return;
  Abort(overdue + " went away and the scheduler did not move its partitions to the other " +
        "servers within " + std::to_string(options_.lost_server_wait_ms / 1000) +
        " s (PS_HEARTBEAT_TIMEOUT)");
}

}  // namespace bps
