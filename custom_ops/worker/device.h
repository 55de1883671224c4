// The devices a worker's tensors may live in, seen through one device table
// (device_api.h): the engine's own stream on each device, a thread that runs what
// waits for the device's work, and a pool of pinned host buffers.
//
// Threads: the table's callbacks arrive on the device's threads (CUDA's), where
// nothing may call the table again; they only queue their work for the completion
// thread here, which runs it in the order the device finished it.
#ifndef TF_BPS_WORKER_DEVICE_H_
#define TF_BPS_WORKER_DEVICE_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../common/common.h"
#include "device_api.h"

namespace bps {

class PinnedPool;

// One pinned host buffer of a pool, handed back when the handle goes.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedPool* pool, int device, char* data, size_t capacity)
      : pool_(pool), device_(device), data_(data), capacity_(capacity) {}
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Reset(); }

  char* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  void Reset();

 private:
  PinnedPool* pool_ = nullptr;
  int device_ = 0;
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

// Pinned host memory is slow to allocate (it maps and locks pages), so buffers are
// reused across steps: a training step asks for the same sizes every time. The pool
// never holds more than the most bytes that were ever in use at once (what the
// largest step had in flight): a fresh buffer that would pass that frees idle ones.
// Buffers are kept per device, whose context made them.
class PinnedPool {
 public:
  explicit PinnedPool(const bps_device_api* api) : api_(api) {}
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A buffer of at least `bytes` for copies of `device`.
  Status Acquire(int device, size_t bytes, PinnedBuffer* buffer);
  // Sizes are rounded up to a class, so that a tensor's buffer fits it in every step.
  static size_t SizeClass(size_t bytes);

  size_t in_use_bytes() const;
  size_t idle_bytes() const;
  size_t peak_bytes() const;

 private:
  friend class PinnedBuffer;
  struct Idle {
    int device;
    char* data;
  };
  void Release(int device, char* data, size_t capacity);
  // Takes idle buffers, largest first, until in use and idle together fit in `limit`;
  // the caller frees them once the lock is let go (freeing pinned memory may wait
  // for the device).
  std::vector<std::pair<size_t, Idle>> TrimLocked(size_t limit);
  void Free(const std::vector<std::pair<size_t, Idle>>& buffers);

  const bps_device_api* const api_;
  mutable std::mutex mutex_;
  std::multimap<std::pair<int, size_t>, char*> idle_;  // by device and capacity
  size_t idle_bytes_ = 0;
  size_t in_use_ = 0;
  size_t peak_ = 0;
};

class Devices {
 public:
  // `api` lives as long as the process (a loaded library's table, or the stand-in).
  explicit Devices(const bps_device_api* api);
  ~Devices();
  Devices(const Devices&) = delete;
  Devices& operator=(const Devices&) = delete;

  const bps_device_api& api() const { return *api_; }
  PinnedPool& pool() { return pool_; }
  // The engine's stream on `device`, made on first use.
  Status Stream(int device, void** stream);
  // Runs `then` on the completion thread once the work queued so far on the engine's
  // stream of `device` is done.
  Status WhenDone(int device, std::function<void()> then);
  // The table's last failure as a Status: `what` failed on `device`, and why.
  Status Failure(const std::string& what, int device) const;

 private:
  struct Callback;
  static void Trampoline(void* callback);
  void CompletionLoop();

  const bps_device_api* const api_;
  PinnedPool pool_;
  std::mutex streams_mutex_;
  std::unordered_map<int, void*> streams_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> finished_;
  int outstanding_ = 0;  // callbacks queued on a device and not yet run here
  bool stopping_ = false;
  std::thread completion_;
};

// The table in which host memory stands in for a device (device_host.cc): "device"
// pointers are host pointers, each stream is a thread running its work in order.
const bps_device_api* HostStandInDevice();

}  // namespace bps

#endif  // TF_BPS_WORKER_DEVICE_H_
