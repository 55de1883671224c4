#include "device_staging.h"

#include "../common/logging.h"
#include "../common/reduce.h"
#include "op_policy.h"

namespace bps {

Status DeviceStaging::Prepare(std::shared_ptr<Devices> devices, TaskSpec* spec,
                              AllocateFn* allocate, std::shared_ptr<DeviceStaging>* staging) {
  auto made = std::make_shared<DeviceStaging>(std::move(devices), *spec);
  Status status = made->devices_->Stream(made->device_, &made->engine_stream_);
  if (status.ok())
    status = made->devices_->pool().Acquire(made->device_, spec->bytes, &made->input_);
  if (!status.ok()) return status.WithSuffix(" (tensor '" + spec->op.name + "')");
  spec->input = made->input_.data();
  if (OpPolicyFor(spec->op.kind).OutputIsInputSized()) {
    // Each partition's answer lands where its push was read from, after the push.
    made->host_output_ = made->input_.data();
    spec->output = made->host_output_;
  } else {
    spec->output = nullptr;
    const DataType dtype = spec->op.dtype;
    DeviceStaging* self = made.get();
    *allocate = [self, dtype, adapter = std::move(*allocate)](
                    int index, const std::vector<int64_t>& shape, Status* status) -> void* {
      void* given = adapter ? adapter(index, shape, status) : nullptr;
      if (index != 0 || !given) return given;  // an alltoall's splits stay on the host
      size_t bytes = DataTypeSize(dtype);
      for (int64_t dim : shape) bytes *= static_cast<size_t>(dim);
      return self->AttachOutput(given, bytes, status);
    };
  }
  *staging = std::move(made);
  return Status::OK();
}

DeviceStaging::DeviceStaging(std::shared_ptr<Devices> devices, const TaskSpec& spec)
    : devices_(std::move(devices)),
      device_(spec.place.device),
      caller_stream_(spec.place.stream),
      device_input_(static_cast<const char*>(spec.input)),
      input_bytes_(spec.bytes),
      device_output_(static_cast<char*>(spec.output)) {}

void* DeviceStaging::AttachOutput(void* device_output, size_t bytes, Status* status) {
  // The framework may hand out memory its stream still uses for work queued after the
  // input was: the copies into it wait for that stream again.
  if (devices_->api().stream_wait(device_, engine_stream_, caller_stream_) != 0) {
    *status = devices_->Failure("the engine's stream cannot wait for the caller's", device_);
    return nullptr;
  }
  *status = devices_->pool().Acquire(device_, bytes, &output_);
  if (!status->ok()) return nullptr;
  device_output_ = static_cast<char*>(device_output);
  host_output_ = output_.data();
  return host_output_;
}

Status DeviceStaging::QueueCopy(void* dst, const void* src, size_t bytes) {
  if (devices_->api().copy(device_, dst, src, bytes, engine_stream_) == 0) return Status::OK();
  return devices_->Failure("cannot queue a copy of " + std::to_string(bytes) + " bytes", device_);
}

Status DeviceStaging::StageInput(const std::shared_ptr<Task>& task, size_t piece,
                                 Timeline* tracer, Route route) {
  route_ = std::move(route);
  piece_ = std::max<size_t>(1, piece);
  tracer_ = tracer;
  if (!task->BeginIo()) {  // failed already: nothing is staged, and nothing goes
    Refuse();
    return Status::OK();
  }
  // The bracket keeps the tensors' memory in use until the engine's work on them ran.
  auto fail = [&](const Status& status) {
    Refuse();
    task->EndIo();
    return status;
  };
  const bps_device_api& api = devices_->api();
  if (api.stream_wait(device_, engine_stream_, caller_stream_) != 0)
    return fail(devices_->Failure("the engine's stream cannot wait for the caller's", device_));
  const Declaration& op = task->op();
  const bool broadcast = op.kind == OpKind::kBroadcast;
  const bool root = broadcast && op.root_rank == task->group().ranks[task->group().index];
  if (root && device_output_ != device_input_) {
    // The root's output is its input; nothing comes back for it.
    Status status = QueueCopy(device_output_, device_input_, input_bytes_);
    if (!status.ok()) return fail(status);
  }
  if ((broadcast && !root) || input_bytes_ == 0) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      staged_ = input_bytes_;
    }
    task->EndIo();
    return Status::OK();
  }
  for (size_t offset = 0; offset < input_bytes_; offset += piece_) {
    const size_t length = std::min(piece_, input_bytes_ - offset);
    const bool last = offset + length == input_bytes_;
    const int64_t queued_at = tracer_ ? Timeline::Now() : 0;
    Status status = QueueCopy(input_.data() + offset, device_input_ + offset, length);
    if (status.ok())
      status = devices_->WhenDone(device_, [this, task, offset, length, last, queued_at] {
        OnPieceStaged(task, offset, length, last, queued_at);
      });
    if (!status.ok()) {
      task->Fail(status.WithSuffix(" (tensor '" + task->name() + "')"));
      Refuse();
      // What was queued still runs: the bracket stays open until it has.
      if (!devices_->WhenDone(device_, [task] { task->EndIo(); }).ok()) task->EndIo();
      return Status::OK();
    }
  }
  return Status::OK();
}

void DeviceStaging::Refuse() {
  std::vector<PartitionTask> held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    refused_ = true;
    held.swap(held_);
  }
  for (const PartitionTask& item : held) route_.drop(item);
}

Status DeviceStaging::PrepareOnHost(const Task& task, size_t offset, size_t length) {
  const Declaration& op = task.op();
  if (IsReduction(op.kind) && op.prescale != 1.0)
    ScaleInPlace(op.dtype, input_.data() + offset, length / DataTypeSize(op.dtype), op.prescale);
  return route_.check ? route_.check(input_.data() + offset, length) : Status::OK();
}

void DeviceStaging::OnPieceStaged(const std::shared_ptr<Task>& task, size_t offset, size_t length,
                                  bool last, int64_t queued_at) {
  if (tracer_)
    tracer_->Stage(task->trace_session(), task->name(), task->round(),
                   static_cast<uint32_t>(offset / piece_), "COPY_IN", queued_at,
                   Timeline::Now());
  Status checked = PrepareOnHost(*task, offset, length);
  // A task that failed meanwhile sends nothing more (its partitions are dropped).
  const bool refuse = !checked.ok() || task->failed();
  std::vector<PartitionTask> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    staged_ = offset + length;
    if (refuse) refused_ = true;
    const char* staged_end = input_.data() + staged_;
    for (auto it = held_.begin(); it != held_.end();) {
      if (refuse || it->data + it->push_length <= staged_end) {
        ready.push_back(std::move(*it));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (!checked.ok()) task->Fail(checked);
  for (PartitionTask& item : ready) Forward(std::move(item), refuse);
  if (last) task->EndIo();
}

Status DeviceStaging::StageSums(const std::shared_ptr<Task>& task,
                                std::vector<PartitionTask> items, void* after, Route route) {
  route_ = std::move(route);
  if (devices_->api().stream_wait(device_, engine_stream_, after) != 0)
    return devices_->Failure("the engine's stream cannot wait for the local merge's", device_);
  for (PartitionTask& item : items) {
    if (!task->BeginIo()) {
      route_.drop(item);
      continue;
    }
    const size_t offset = item.offset;
    const size_t length = item.push_length;
    Status status = QueueCopy(input_.data() + offset, device_output_ + offset, length);
    if (status.ok())
      status = devices_->WhenDone(device_, [this, task, offset, length, item]() mutable {
        Status checked = task->failed() ? Status::OK() : PrepareOnHost(*task, offset, length);
        if (!checked.ok()) task->Fail(checked);
        Forward(std::move(item), task->failed());
        task->EndIo();
      });
    if (!status.ok()) {
      route_.drop(item);
      task->EndIo();
      return status;
    }
  }
  return Status::OK();
}

void DeviceStaging::Release(PartitionTask item) {
  const char* begin = item.data;
  const bool from_input = item.push_length > 0 && begin >= input_.data() &&
                          begin < input_.data() + input_bytes_;
  bool refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    refused = refused_;
    if (!refused && from_input && begin + item.push_length > input_.data() + staged_) {
      held_.push_back(std::move(item));
      return;
    }
  }
  Forward(std::move(item), refused);
}

void DeviceStaging::Forward(PartitionTask item, bool refused) {
  if (refused) return route_.drop(item);
  route_.send(std::move(item));
}

Status DeviceStaging::FinishOnDevice(const Task& task, size_t offset, size_t bytes) {
  const Declaration& op = task.op();
  const bps_device_api& api = devices_->api();
  const size_t count = bytes / DataTypeSize(op.dtype);
  const int dtype = static_cast<int>(op.dtype);
  char* at = device_output_ + offset;
  if (op.reduce_op == ReduceOp::kAverage &&
      api.divide(device_, at, count, dtype, task.group().size(), engine_stream_) != 0)
    return devices_->Failure("cannot queue an average", device_);
  if (op.postscale != 1.0 &&
      api.scale(device_, at, count, dtype, op.postscale, engine_stream_) != 0)
    return devices_->Failure("cannot queue a postscale", device_);
  return Status::OK();
}

void DeviceStaging::Deliver(const std::shared_ptr<Task>& task, size_t offset, size_t bytes,
                            bool finish) {
  if (!task->BeginIo()) return;  // failed meanwhile: the output is not wanted
  const int64_t queued_at = tracer_ ? Timeline::Now() : 0;
  const auto part = static_cast<uint32_t>(offset / piece_);
  Timeline* tracer = tracer_;
  Status status = QueueCopy(device_output_ + offset, host_output_ + offset, bytes);
  if (status.ok() && finish && IsReduction(task->kind()))
    status = FinishOnDevice(*task, offset, bytes);
  if (status.ok() && on_answer_) on_answer_();
  if (status.ok())
    status = devices_->WhenDone(device_, [task, part, queued_at, tracer] {
      if (tracer)
        tracer->Stage(task->trace_session(), task->name(), task->round(), part, "COPY_OUT",
                      queued_at, Timeline::Now());
      task->PartitionDone();
      task->EndIo();
    });
  if (!status.ok()) {
    task->Fail(status.WithSuffix(" (tensor '" + task->name() + "')"));
    task->EndIo();
  }
}

Status DeviceStaging::Finish() {
  if (devices_->api().stream_wait(device_, caller_stream_, engine_stream_) == 0)
    return Status::OK();
  return devices_->Failure("the caller's stream cannot wait for the engine's", device_);
}

void StagedTasks::Began(const DeviceStaging* staging, const std::shared_ptr<Task>& task) {
  std::lock_guard<std::mutex> lock(mutex_);
  open_[staging] = task;
}

void StagedTasks::Ended(const DeviceStaging* staging) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    open_.erase(staging);
  }
  ended_.notify_all();
}

void StagedTasks::FailAll(const Status& reason, std::chrono::milliseconds wait) {
  std::vector<std::shared_ptr<Task>> open;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [staging, task] : open_)
      if (auto alive = task.lock()) open.push_back(std::move(alive));
  }
  for (auto& task : open) task->Fail(reason);  // completes it once its copies ran
  open.clear();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ended_.wait_for(lock, wait, [this] { return open_.empty(); }))
    BPS_LOG(kWarning) << open_.size()
                      << " operation(s) on device memory still wait for their device";
}

void Delivered(const std::shared_ptr<Task>& task, size_t offset, size_t bytes, bool raw) {
  DeviceStaging* staging = task->staging();
  if (!staging || bytes == 0) {
    task->PartitionDone();
    return;
  }
  staging->Deliver(task, offset, bytes, raw);
}

}  // namespace bps
