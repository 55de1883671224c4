#include "device.h"

#include <chrono>

#include "../common/logging.h"

namespace bps {

// ---------------------------------------------------------------------------
// PinnedBuffer, PinnedPool

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = other.pool_;
    device_ = other.device_;
    data_ = other.data_;
    capacity_ = other.capacity_;
    other.pool_ = nullptr;
    other.data_ = nullptr;
    other.capacity_ = 0;
  }
  return *this;
}

void PinnedBuffer::Reset() {
  if (pool_ && data_) pool_->Release(device_, data_, capacity_);
  pool_ = nullptr;
  data_ = nullptr;
  capacity_ = 0;
}

PinnedPool::~PinnedPool() {
  std::vector<std::pair<size_t, Idle>> freed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    freed = TrimLocked(0);
  }
  Free(freed);
}

size_t PinnedPool::SizeClass(size_t bytes) {
  constexpr size_t kSmallest = 4096, kStep = 1 << 20;
  if (bytes >= kStep) return (bytes + kStep - 1) / kStep * kStep;
  size_t size = kSmallest;
  while (size < bytes) size *= 2;
  return size;
}

Status PinnedPool::Acquire(int device, size_t bytes, PinnedBuffer* buffer) {
  const size_t capacity = SizeClass(bytes);
  std::vector<std::pair<size_t, Idle>> freed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto idle = idle_.find({device, capacity});
    if (idle != idle_.end()) {
      char* data = idle->second;
      idle_.erase(idle);
      idle_bytes_ -= capacity;
      in_use_ += capacity;
      *buffer = PinnedBuffer(this, device, data, capacity);
      return Status::OK();
    }
    in_use_ += capacity;  // the new buffer counts from here
    peak_ = std::max(peak_, in_use_);
    freed = TrimLocked(peak_);
  }
  Free(freed);
  void* data = nullptr;
  if (api_->host_alloc(device, capacity, &data) != 0) {
    const std::string why = api_->last_error();
    std::lock_guard<std::mutex> undo(mutex_);
    in_use_ -= capacity;
    return Status::Error(ErrorKind::kInternal, "cannot pin " + std::to_string(capacity) +
                                                   " bytes of host memory (" + api_->name +
                                                   "): " + why);
  }
  *buffer = PinnedBuffer(this, device, static_cast<char*>(data), capacity);
  return Status::OK();
}

void PinnedPool::Release(int device, char* data, size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_use_ -= capacity;
  idle_.emplace(std::make_pair(device, capacity), data);
  idle_bytes_ += capacity;
}

std::vector<std::pair<size_t, PinnedPool::Idle>> PinnedPool::TrimLocked(size_t limit) {
  std::vector<std::pair<size_t, Idle>> taken;
  while (!idle_.empty() && in_use_ + idle_bytes_ > limit) {
    // The largest, whichever device's.
    auto largest = idle_.begin();
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if (it->first.second > largest->first.second) largest = it;
    taken.push_back({largest->first.second, Idle{largest->first.first, largest->second}});
    idle_bytes_ -= largest->first.second;
    idle_.erase(largest);
  }
  return taken;
}

void PinnedPool::Free(const std::vector<std::pair<size_t, Idle>>& buffers) {
  for (const auto& [capacity, idle] : buffers) api_->host_free(idle.device, idle.data);
}

size_t PinnedPool::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_;
}

size_t PinnedPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_bytes_;
}

size_t PinnedPool::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

// ---------------------------------------------------------------------------
// Devices

struct Devices::Callback {
  Devices* devices;
  std::function<void()> then;
};

Devices::Devices(const bps_device_api* api)
    : api_(api), pool_(api), completion_([this] { CompletionLoop(); }) {}

Devices::~Devices() {
  {
    // What the devices still owe arrives within a copy's time; a device that never
    // answers must not hang the process's exit.
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30),
                      [this] { return outstanding_ == 0 && finished_.empty(); }))
      BPS_LOG(kWarning) << outstanding_ << " " << api_->name
                        << " callback(s) never arrived; leaving them";
    stopping_ = true;
  }
  cv_.notify_all();
  completion_.join();
  std::lock_guard<std::mutex> lock(streams_mutex_);
  for (auto& [device, stream] : streams_) api_->stream_destroy(device, stream);
}

Status Devices::Failure(const std::string& what, int device) const {
  return Status::Error(ErrorKind::kInternal, what + " on " + api_->name + " device " +
                                                 std::to_string(device) + ": " +
                                                 api_->last_error());
}

Status Devices::Stream(int device, void** stream) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  auto known = streams_.find(device);
  if (known != streams_.end()) {
    *stream = known->second;
    return Status::OK();
  }
  if (api_->stream_create(device, stream) != 0)
    return Failure("cannot create the engine's stream", device);
  streams_.emplace(device, *stream);
  return Status::OK();
}

void Devices::Trampoline(void* arg) {
  // On the device's thread: only hand the work over.
  auto* callback = static_cast<Callback*>(arg);
  Devices* devices = callback->devices;
  {
    std::lock_guard<std::mutex> lock(devices->mutex_);
    devices->finished_.push_back(std::move(callback->then));
    --devices->outstanding_;
  }
  devices->cv_.notify_all();
  delete callback;
}

Status Devices::WhenDone(int device, std::function<void()> then) {
  void* stream = nullptr;
  Status status = Stream(device, &stream);
  if (!status.ok()) return status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++outstanding_;
  }
  auto* callback = new Callback{this, std::move(then)};
  if (api_->call_when_done(device, stream, &Trampoline, callback) == 0) return Status::OK();
  delete callback;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --outstanding_;
  }
  cv_.notify_all();
  return Failure("cannot queue a completion callback", device);
}

void Devices::CompletionLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !finished_.empty(); });
    if (finished_.empty()) return;  // stopping, nothing left
    std::function<void()> then = std::move(finished_.front());
    finished_.pop_front();
    lock.unlock();
    then();
    // What `then` held (a task, its pinned buffers) goes before the lock is taken again.
    then = nullptr;
    lock.lock();
    if (finished_.empty()) cv_.notify_all();  // the destructor may be waiting
  }
}

}  // namespace bps
