// Collectives among processes whose "devices" are host memory (device_host.cc): what
// NCCL does between GPUs, done through one shared-memory segment per group, so that
// the local merge of device tensors runs and is tested on machines without a GPU.
// Each collective moves its data through per-member slots a chunk at a time, members
// meeting at a barrier in shared memory between the steps.
#ifndef TF_BPS_WORKER_DEVICE_HOST_GROUP_H_
#define TF_BPS_WORKER_DEVICE_HOST_GROUP_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "../common/common.h"

namespace bps {

class HostGroup {
 public:
  // A fresh id: the segment's name, random.
  static void MakeId(void* id);
  // Joins group `id` of `size` members as `member`, once every member has (or fails
  // after `wait`). The segment's name is removed once all have mapped it.
  static Status Open(const void* id, int size, int member, std::chrono::milliseconds wait,
                     HostGroup** group);
  ~HostGroup();

  // Blocking collectives, as NCCL's (device_api.h); a member missing for longer than
  // the wait breaks the group, and every later collective fails at once.
  Status Reduce(const void* src, void* dst, size_t count, DataType dtype, ReduceOp op, int root);
  Status Broadcast(void* buf, size_t count, DataType dtype, int root);
  // Why the group broke; empty while it is whole.
  std::string broken() const;
  // Members may be gone: collectives end instead of waiting for them.
  void Abort() { aborted_.store(true); }

 private:
  struct Control {
    std::atomic<uint32_t> arrived;
    std::atomic<uint32_t> generation;
  };
  static constexpr size_t kChunk = 1 << 20;

  HostGroup(void* mapping, size_t bytes, int size, int member, std::chrono::milliseconds wait);
  Status Barrier(const char* during);
  Status Break(std::string why);
  char* slot(int member) const;

  void* const mapping_;
  const size_t bytes_;
  Control* const control_;
  const int size_;
  const int member_;
  const std::chrono::milliseconds wait_;
  std::atomic<bool> aborted_{false};
  // Why it broke: written once, by the thread running the collectives, before
  // is_broken_ says so.
  std::string broken_;
  std::atomic<bool> is_broken_{false};
};

}  // namespace bps

#endif  // TF_BPS_WORKER_DEVICE_HOST_GROUP_H_
