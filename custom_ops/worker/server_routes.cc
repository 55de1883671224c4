#include "server_routes.h"

#include <string>

namespace bps {

ServerRoutes::ServerRoutes(const std::vector<int>& cycle, size_t num_servers)
    : length_(cycle.size()),
      places_(new std::atomic<int>[cycle.size()]),
      removed_(num_servers, false) {
  for (size_t i = 0; i < length_; ++i) places_[i].store(cycle[i], std::memory_order_relaxed);
}

Status ServerRoutes::Remove(int lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lost < 0 || static_cast<size_t>(lost) >= removed_.size())
    return Status::Error(ErrorKind::kInvalidArgument,
                         "no server " + std::to_string(lost) + " to remove");
  if (removed_[lost]) return Status::OK();
  std::vector<int> left;
  for (size_t i = 0; i < removed_.size(); ++i)
    if (!removed_[i] && static_cast<int>(i) != lost) left.push_back(static_cast<int>(i));
  if (left.empty())
    return Status::Error(ErrorKind::kPeerGone,
                         "server " + std::to_string(lost) + " was the last server");
  removed_[lost] = true;
  size_t next = 0;
  for (size_t i = 0; i < length_; ++i) {
    if (places_[i].load(std::memory_order_relaxed) != lost) continue;
    places_[i].store(left[next++ % left.size()], std::memory_order_release);
  }
  return Status::OK();
}

bool ServerRoutes::removed(int server) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return server >= 0 && static_cast<size_t>(server) < removed_.size() && removed_[server];
}

}  // namespace bps
