#include "credits.h"

namespace bps {

bool PushCredits::TryTake(uint64_t priority, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool admitted = limit_ == 0 || priorities_.empty() || in_flight_ + bytes <= limit_ ||
                        priority < *priorities_.begin() ||
                        Clock::now() - last_progress_ >= kPatience;
  if (admitted) TakeLocked(priority, bytes);
  return admitted;
}

void PushCredits::TakeLocked(uint64_t priority, size_t bytes) {
  in_flight_ += bytes;
  priorities_.insert(priority);
  last_progress_ = Clock::now();
}

void PushCredits::Return(uint64_t priority, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = priorities_.find(priority);
  if (it == priorities_.end()) return;  // never taken: nothing to give back
  priorities_.erase(it);
  in_flight_ -= bytes;
  last_progress_ = Clock::now();
}

size_t PushCredits::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_flight_;
}

}  // namespace bps
