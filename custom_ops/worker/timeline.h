// The communication timeline (BYTEPS_TRACE_ON): when each operation on a tensor and
// each stage of each of its partitions began and ended, for the steps of a window,
// written once as Chrome trace events (chrome://tracing, Perfetto).
//
// A step is a tensor's round: the n-th operation on a name belongs to step n, which for
// gradients is the n-th optimizer step. Recording is one lock and one vector append per
// event; the file is written on a thread of its own once every operation of the window
// has ended and a later step has begun (or at shutdown), so training does not stall.
#ifndef TF_BPS_WORKER_TIMELINE_H_
#define TF_BPS_WORKER_TIMELINE_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace bps {

class Timeline {
 public:
  // Traces steps `first` to `last` into the file `path` (its folder must exist).
  Timeline(std::string path, uint32_t first, uint32_t last);
  ~Timeline();  // Writes the file if it has not been written yet.
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Microseconds since the epoch: comparable between the workers of a host.
  static int64_t Now();
  bool Traces(uint32_t step) const { return step >= first_ && step <= last_; }

  // An operation on `tensor` of `step` starts or has ended (`start` is when it began).
  void OperationStarted(uint32_t step);
  void OperationEnded(const std::string& tensor, uint32_t step, int64_t start);
  // A stage ("QUEUE", "PUSH", "PULL", ...) of partition `part` of `tensor` at `step`.
  void Stage(const std::string& tensor, uint32_t step, uint32_t part, const char* stage,
             int64_t start, int64_t end);
  // Writes the file now unless it has been (at shutdown), and waits for the writer.
  void Finish();

 private:
  struct Event {
    std::string tensor;
    const char* stage;  // null: the whole operation
    uint32_t step;
    uint32_t part;
    int64_t start;
    int64_t duration;
  };
  void StartWriterLocked();
  static void Write(const std::string& path, const std::vector<Event>& events);

  const std::string path_;
  const uint32_t first_;
  const uint32_t last_;
  std::mutex mutex_;
  std::vector<Event> events_;
  int open_operations_ = 0;  // of the window, started and not yet ended
  bool past_window_ = false;
  // Set once, under the mutex; read without it so that, once the file is on its way,
  // operations of later steps no longer take the lock.
  std::atomic<bool> written_{false};
  std::thread writer_;
};

}  // namespace bps

#endif  // TF_BPS_WORKER_TIMELINE_H_
