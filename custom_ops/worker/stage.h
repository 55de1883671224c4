// A stage of the worker's pipeline: a queue served by a thread of its own. Items
// leave in priority order, so a stage never holds an urgent partition behind a
// bulky one. A stage may also hold its head item back until an admission rule lets
// it go (the push stage's scheduling credit, credits.h). The items' owners record
// their time in each stage on the timeline (timeline.h).
#ifndef TF_BPS_WORKER_STAGE_H_
#define TF_BPS_WORKER_STAGE_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bps {

// `After(a, b)` is true when `a` must leave after `b` (a std::priority_queue order).
template <typename Item, typename After>
class Stage {
 public:
  // `serve` handles one item on the stage's thread; returning false ends the stage
  // (its link broke, say), dropping what is still queued.
  using Serve = std::function<bool(Item&)>;
  // Says whether the head item may leave now, taking whatever it needs if so. Asked
  // again on Recheck() and at least every kAdmitPoll, so a rule may have deadlines.
  using Admit = std::function<bool(const Item&)>;
  static constexpr std::chrono::milliseconds kAdmitPoll{50};

  explicit Stage(std::string name) : name_(std::move(name)) {}
  ~Stage() {
    Close();
    Join();
  }
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  const std::string& name() const { return name_; }

  void Start(Serve serve, Admit admit = nullptr) {
    thread_ = std::thread(
        [this, serve = std::move(serve), admit = std::move(admit)] { Run(serve, admit); });
  }

  void Push(Item item) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push(std::move(item));
    }
    cv_.notify_one();
  }

  // What the admission rule depends on changed (credit came back, say).
  void Recheck() {
    // Taking the lock orders this wake-up after Run's check, so it cannot be lost.
    { std::lock_guard<std::mutex> lock(mutex_); }
    cv_.notify_all();
  }

  // Stops serving; items still queued are dropped (their tasks fail elsewhere).
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    cv_.notify_all();
  }

  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run(const Serve& serve, const Admit& admit) {
    while (true) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        while (true) {
          cv_.wait(lock, [this] { return closed_ || !queue_.empty(); });
          if (closed_) return;
          if (!admit || admit(queue_.top())) break;
          cv_.wait_for(lock, kAdmitPoll);
        }
        item = queue_.top();
        queue_.pop();
      }
      if (!serve(item)) return;
    }
  }

  const std::string name_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::priority_queue<Item, std::vector<Item>, After> queue_;
  bool closed_ = false;
  std::thread thread_;
};

}  // namespace bps

#endif  // TF_BPS_WORKER_STAGE_H_
