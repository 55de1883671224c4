// Which server each partition of a tensor goes to: the servers' cycle (ServerCycle in
// task.h), where an elastic job's lost servers give their places to the others.
#ifndef TF_BPS_WORKER_SERVER_ROUTES_H_
#define TF_BPS_WORKER_SERVER_ROUTES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "../common/common.h"

namespace bps {

class ServerRoutes {
 public:
  // `cycle`: server indices, each as often as its share (ServerCycle).
  ServerRoutes(const std::vector<int>& cycle, size_t num_servers);

  // The server of partition `part` of tensor `tensor_id`. Lock-free: the hot path.
  int For(uint64_t tensor_id, uint32_t part) const {
    return places_[(tensor_id % length_ + part) % length_].load(std::memory_order_acquire);
  }
  size_t cycle_length() const { return length_; }

  // Server `lost` takes no more partitions: its places go to the servers left, in turn
  // and in cycle order, so that every worker that removes the same servers in the same
  // order routes alike (the scheduler announces them in one order to all). An error if
  // it is unknown or the last one; removing it twice changes nothing.
  Status Remove(int lost);
  bool removed(int server) const;

 private:
  const size_t length_;
  std::unique_ptr<std::atomic<int>[]> places_;
  mutable std::mutex mutex_;  // Remove against Remove and removed()
  std::vector<bool> removed_;
};

}  // namespace bps

#endif  // TF_BPS_WORKER_SERVER_ROUTES_H_
