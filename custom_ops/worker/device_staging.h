// Where a task on device memory meets the host pipeline. Pinned host buffers stand in
// for its input and output: the input comes over piece by piece on the engine's stream
// (after the work the caller queued before), and each partition goes on to its server
// as soon as the piece holding it has arrived; each answer goes back to the device as
// it arrives. The caller's stream then waits for those copies, never for the network.
//
// Threads: Release runs on the threads that plan and dispatch partitions; pieces
// arrive, and answers finish, on the completion thread of Devices (device.h).
#ifndef TF_BPS_WORKER_DEVICE_STAGING_H_
#define TF_BPS_WORKER_DEVICE_STAGING_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <string>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <vector>

#include "device.h"
#include "task.h"
#include "timeline.h"

namespace bps {

class DeviceStaging {
 public:
  // Where a task's partitions go from here.
  struct Route {
    // A partition whose bytes are on the host.
    std::function<void(PartitionTask)> send;
    // A partition that will never be sent (its task failed first): its server and the
    // other workers must hear that this worker gave up the round.
    std::function<void(const PartitionTask&)> drop;
    // Checks each piece as it arrives (PERSEUS_ALLREDUCE_NANCHECK); null: none.
    std::function<Status(const char* data, size_t bytes)> check;
  };

  // For a task of `spec` on a device: points the spec's input (and its output, where
  // that has the input's size) at pinned buffers, and wraps `allocate` so that an
  // output sized later gets one too.
  static Status Prepare(std::shared_ptr<Devices> devices, TaskSpec* spec, AllocateFn* allocate,
                        std::shared_ptr<DeviceStaging>* staging);

  DeviceStaging(std::shared_ptr<Devices> devices, const TaskSpec& spec);

  // Queues the input's copy to the host in pieces of `piece` bytes (whole elements),
  // after the caller's queued work. Partitions released meanwhile go on as their piece
  // arrives, prescaled (a reduction's) and checked; a piece that fails the check fails
  // the task, and what it has not sent is dropped. `tracer`: the timeline recording
  // the task (its copies are stages), or null.
  Status StageInput(const std::shared_ptr<Task>& task, size_t piece, Timeline* tracer,
                    Route route);
  // Sends `item` on now if what it pushes is on the host, else once it is.
  void Release(PartitionTask item);
  // `bytes` of the answer at `offset` of the output are on the host: they are copied
  // to the device (and, with `finish`, a reduction's average and postscale applied
  // there), and then that partition of the task is done.
  void Deliver(const std::shared_ptr<Task>& task, size_t offset, size_t bytes, bool finish);
  // The task ended: the caller's stream waits for the engine's work on its tensors
  // (the output's copies; after a failure, whatever still uses its memory).
  Status Finish();
  // The task failed: partitions held, and any released from now on, are dropped.
  void Refuse();

  // The device merge (device_merge.h) works on the device's tensors directly.
  const char* device_input() const { return device_input_; }
  char* device_output() const { return device_output_; }
  // Once the work queued on `after` so far is done, copies each of `items` from the
  // device output (where the host's sums lie) to the pinned buffer it pushes from,
  // then prescales, checks and sends it as StageInput's pieces are.
  Status StageSums(const std::shared_ptr<Task>& task, std::vector<PartitionTask> items,
                   void* after, Route route);
  // Called each time an answer's copy to the device is queued (Deliver).
  void set_on_answer(std::function<void()> on_answer) { on_answer_ = std::move(on_answer); }

 private:
  void* AttachOutput(void* device_output, size_t bytes, Status* status);
  void OnPieceStaged(const std::shared_ptr<Task>& task, size_t offset, size_t length,
                     bool last, int64_t queued_at);
  // A reduction's average and postscale of the answer at `offset`, queued on the device.
  Status FinishOnDevice(const Task& task, size_t offset, size_t bytes);
  // Prescales a reduction's `length` bytes on the host at `offset`, and checks them.
  Status PrepareOnHost(const Task& task, size_t offset, size_t length);
  Status QueueCopy(void* dst, const void* src, size_t bytes);
  // Sends `item` on, or drops it once the task was refused.
  void Forward(PartitionTask item, bool refused);

  const std::shared_ptr<Devices> devices_;
  const int device_;
  void* const caller_stream_;
  void* engine_stream_ = nullptr;
  const char* const device_input_;
  const size_t input_bytes_;
  char* device_output_;
  PinnedBuffer input_;
  PinnedBuffer output_;  // empty where the output is the input's buffer
  char* host_output_ = nullptr;
  Route route_;
  std::function<void()> on_answer_;
  size_t piece_ = 1;  // StageInput's
  Timeline* tracer_ = nullptr;

  std::mutex mutex_;
  size_t staged_ = 0;  // the input's first `staged_` bytes are on the host
  bool refused_ = false;  // a piece failed its check: nothing more is sent
  std::vector<PartitionTask> held_;
};

// The tasks on device memory that have not completed, so that a worker stopping can
// fail them and wait until they did: until then, the engine's copies and callbacks may
// still reach the worker through them.
class StagedTasks {
 public:
  void Began(const DeviceStaging* staging, const std::shared_ptr<Task>& task);
  void Ended(const DeviceStaging* staging);
  // Fails every task still open with `reason` and waits up to `wait` for them to end.
  void FailAll(const Status& reason, std::chrono::milliseconds wait);

 private:
  std::mutex mutex_;
  std::condition_variable ended_;
  std::unordered_map<const DeviceStaging*, std::weak_ptr<Task>> open_;
};

// A partition's answer is in the task's output: done at once on the host, or once
// copied to the device (DeviceStaging::Deliver). `raw`: a server's answer, which a
// reduction on the device still averages and scales there (on the host, the server
// link did: ServerLink::FinishPartition); else a result finished already.
void Delivered(const std::shared_ptr<Task>& task, size_t offset, size_t bytes, bool raw);

}  // namespace bps

#endif  // TF_BPS_WORKER_DEVICE_STAGING_H_
