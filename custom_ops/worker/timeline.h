// The communication timeline: when each operation on a tensor and each stage of each
// of its partitions began and ended, written as Chrome trace events (chrome://tracing,
// Perfetto).
//
// A worker has one Timeline for its lifetime, which records one file at a time: a
// *recording* (a session) takes the operations that start while it is current, of a
// window of steps (BYTEPS_TRACE_ON) or every step (Horovod's start_timeline). A step is
// a tensor's round: the n-th operation on a name belongs to step n, which for
// gradients is the n-th optimizer step.
//
// OperationStarted hands out the id of the recording that took the operation (0: none);
// the Task carries it, and its stages and its end are recorded under that id. A
// recording stops taking operations when it is stopped, when another begins, or when a
// later step than its window's begins; its file is written on a thread of its own once
// the operations it took have ended, so training does not stall. Events of a recording
// whose file is on its way are dropped, so nothing grows once a file is written.
//
// Thread safety: every method may be called from any thread. With no recording
// current, OperationStarted is one atomic load; events of traced operations take one
// lock and one vector append.
#ifndef TF_BPS_WORKER_TIMELINE_H_
#define TF_BPS_WORKER_TIMELINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace bps {

class Timeline {
 public:
  static constexpr uint32_t kEveryStep = std::numeric_limits<uint32_t>::max();

  Timeline() = default;
  ~Timeline();  // Finish()
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Microseconds since the epoch: comparable between the workers of a host.
  static int64_t Now();

  // Records the operations of steps `first` to `last` that start from now on into the
  // file `path` (its folder must exist). The recording current until now, if any, takes
  // no more operations, and Start waits up to `wait` for its file (written once the
  // operations it took have ended). Returns the new recording's id; 0 once finished
  // (no recording begins).
  uint32_t Start(std::string path, uint32_t first = 1, uint32_t last = kEveryStep,
                 std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  // Ends the current recording, if any (none: nothing to do), and waits up to `wait`
  // for its file. False (and a warning) if it is not written by then: it will be, once
  // the operations it took have ended.
  bool Stop(std::chrono::milliseconds wait);

  // An operation of `step` starts: the id of the recording that takes it, or 0.
  uint32_t OperationStarted(uint32_t step);
  // That operation, on `tensor`, has ended; it began at `start`.
  void OperationEnded(uint32_t recording, const std::string& tensor, uint32_t step, int64_t start);
  // A stage ("QUEUE", "PUSH", "PULL", ...) of partition `part` of an operation of
  // `recording` on `tensor` at `step`.
  void Stage(uint32_t recording, const std::string& tensor, uint32_t step, uint32_t part,
             const char* stage, int64_t start, int64_t end);
  // At shutdown: writes every file not yet written, with what it holds, and waits for
  // the writer. No recording begins afterwards.
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
  struct Recording {
    uint32_t id;
    std::string path;
    uint32_t first;
    uint32_t last;
    std::vector<Event> events;
    int open_operations = 0;  // taken and not yet ended
    bool closed = false;      // takes no more operations
  };
  struct File {
    uint32_t id;
    std::string path;
    std::vector<Event> events;
  };

  Recording* FindLocked(uint32_t id);
  // The recording takes no more operations; its file is queued once none is open.
  void CloseLocked(Recording* recording);
  // Hands the recording's events to the writer and forgets the recording.
  void QueueFileLocked(uint32_t id);
  bool WrittenLocked(uint32_t id) const;
  // Waits up to `wait` for recording `id`'s file (to `path`); false, with a warning, if
  // it is not written by then.
  bool AwaitLocked(std::unique_lock<std::mutex>& lock, uint32_t id, const std::string& path,
                   std::chrono::milliseconds wait);
  void WriterLoop();
  static void Write(const std::string& path, const std::vector<Event>& events);

  // The recording that takes new operations (0: none). Changed under the mutex; read
  // without it first, so that untraced operations take no lock.
  std::atomic<uint32_t> current_{0};
  std::mutex mutex_;
  std::condition_variable queued_;   // the writer waits for files
  std::condition_variable written_;  // Start and Stop wait for the file they end
  uint32_t last_id_ = 0;
  // Current or waiting for the operations they took to end: one, or a few where
  // recordings were switched while operations ran.
  std::vector<Recording> recordings_;
  std::deque<File> files_;  // to write, in order
  uint32_t writing_ = 0;    // the recording whose file is being written (0: none)
  bool finished_ = false;
  std::thread writer_;  // started with the first file
};

}  // namespace bps

#endif  // TF_BPS_WORKER_TIMELINE_H_
