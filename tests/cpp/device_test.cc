// Unit tests of the worker's device staging (custom_ops/worker/device*.h) with host
// memory standing in for the device: the pinned pool's reuse and bound, a task's
// partitions leaving only once their piece is on the host, then coming back, and the
// stand-in's collectives between two members.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../custom_ops/worker/device.h"
#include "../../custom_ops/worker/device_host_group.h"
#include "../../custom_ops/worker/device_staging.h"
#include "expect.h"

namespace bps {
namespace {

void TestPinnedPoolReusesAndStaysBounded() {
  PinnedPool pool(HostStandInDevice());
  EXPECT(PinnedPool::SizeClass(1) == 4096 && PinnedPool::SizeClass(5000) == 8192);
  EXPECT(PinnedPool::SizeClass((3 << 20) + 1) == (4u << 20));
  char* first = nullptr;
  {
    PinnedBuffer a, b;
    EXPECT(pool.Acquire(0, 3 << 20, &a).ok() && pool.Acquire(0, 100, &b).ok());
    first = a.data();
    EXPECT(pool.in_use_bytes() == (3u << 20) + 4096);
  }
  EXPECT(pool.in_use_bytes() == 0 && pool.idle_bytes() == (3u << 20) + 4096);
  // A thousand steps of the same sizes: the same buffers, nothing more.
  const size_t peak = pool.peak_bytes();
  for (int step = 0; step < 1000; ++step) {
    PinnedBuffer a, b;
    EXPECT(pool.Acquire(0, 3 << 20, &a).ok() && pool.Acquire(0, 4000, &b).ok());
    EXPECT(a.data() == first);
  }
  EXPECT(pool.peak_bytes() == peak && pool.in_use_bytes() + pool.idle_bytes() <= peak);
  // Other sizes: idle buffers go before the pool passes the most ever in use.
  for (size_t mb = 1; mb <= 8; ++mb) {
    PinnedBuffer buffer;
    EXPECT(pool.Acquire(0, mb << 20, &buffer).ok());
    EXPECT(pool.in_use_bytes() + pool.idle_bytes() <= pool.peak_bytes());
  }
  EXPECT(pool.peak_bytes() == (8u << 20));
}

// Waits for a flag set on another thread.
class Latch {
 public:
  void Set() {
    std::lock_guard<std::mutex> lock(mutex_);
    set_ = true;
    cv_.notify_all();
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [this] { return set_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool set_ = false;
};

// Returns once the completion thread has run, and let go of, every callback queued so
// far. The test's own references to the task and the devices are then the last ones:
// were one of those callbacks to hold the last, ~Devices would run on the very thread
// it joins.
void DrainCompletions(Devices* devices) {
  Latch drained;
  EXPECT(devices->WhenDone(0, [&drained] { drained.Set(); }).ok());
  EXPECT(drained.Wait());
}

void TestStagingSendsEachPartitionOnceItsPieceIsOnTheHost() {
  auto devices = std::make_shared<Devices>(HostStandInDevice());
  constexpr size_t kCount = 10000, kPiece = 4000;  // bytes: 10 pieces, the last short
  std::vector<float> device_input(kCount), device_output(kCount, -1.0f);
  for (size_t i = 0; i < kCount; ++i) device_input[i] = static_cast<float>(i);
  void* caller = nullptr;
  EXPECT(devices->api().stream_create(0, &caller) == 0);
  TaskSpec spec;
  spec.op.name = "staged";
  spec.op.kind = OpKind::kPushPull;
  spec.op.dtype = DataType::kFloat32;
  spec.op.shape = {static_cast<int64_t>(kCount)};
  spec.op.prescale = 2.0;
  spec.input = device_input.data();
  spec.output = device_output.data();
  spec.bytes = kCount * sizeof(float);
  spec.place.device = 0;
  spec.place.stream = caller;
  AllocateFn allocate;
  std::shared_ptr<DeviceStaging> staging;
  EXPECT(DeviceStaging::Prepare(devices, &spec, &allocate, &staging).ok());
  EXPECT(spec.input != device_input.data() && spec.output == spec.input);
  const char* host = static_cast<const char*>(spec.input);
  Group group;
  group.ranks = {0};
  Latch done;
  std::atomic<int> done_calls{0};
  auto task = std::make_shared<Task>(spec, group, 1, 0, 1, 10000, allocate,
                                     [&](const Status& status) {
                                       EXPECT(status.ok());
                                       EXPECT(staging->Finish().ok());
                                       ++done_calls;
                                       done.Set();
                                     });
  task->set_staging(staging);
  // The caller's stream is busy when the task comes: nothing may be copied before it ends.
  Latch caller_busy;
  devices->api().call_when_done(0, caller, [](void* latch) { static_cast<Latch*>(latch)->Wait(); },
                                &caller_busy);
  std::mutex sent_mutex;
  std::vector<PartitionTask> sent;
  std::atomic<bool> early{false};
  auto send = [&](PartitionTask item) {
    // What a partition pushes is on the host, prescaled, when it leaves.
    const float* values = reinterpret_cast<const float*>(item.data);
    const size_t first = (item.data - host) / sizeof(float);
    for (size_t i = 0; i < item.push_length / sizeof(float); ++i)
      if (values[i] != 2.0f * static_cast<float>(first + i)) early = true;
    std::lock_guard<std::mutex> lock(sent_mutex);
    sent.push_back(std::move(item));
  };
  std::vector<PartitionTask> plan;
  for (size_t offset = 0; offset < spec.bytes; offset += kPiece) {
    const size_t length = std::min(kPiece, spec.bytes - offset);
    plan.push_back(MakePartition(task, static_cast<uint32_t>(plan.size()), offset, host + offset,
                                 length, length));
  }
  task->Launch(static_cast<int>(plan.size()));
  DeviceStaging::Route route;
  route.send = send;
  std::atomic<int> dropped{0};
  route.drop = [&](const PartitionTask&) { ++dropped; };
  EXPECT(staging->StageInput(task, kPiece, nullptr, route).ok());
  for (PartitionTask& item : plan) staging->Release(item);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(sent_mutex);
    EXPECT(sent.empty());  // all held behind the caller's work
  }
  caller_busy.Set();
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> lock(sent_mutex);
      if (sent.size() == plan.size()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT(!early && dropped == 0);
  std::vector<PartitionTask> answered;
  {
    std::lock_guard<std::mutex> lock(sent_mutex);
    EXPECT(sent.size() == plan.size());
    answered = sent;
  }
  // The answers (here the partition plus one) come back in any order.
  for (auto it = answered.rbegin(); it != answered.rend(); ++it) {
    float* values = reinterpret_cast<float*>(const_cast<char*>(it->data));
    for (size_t i = 0; i < it->reply_length / sizeof(float); ++i) values[i] += 1.0f;
    Delivered(task, it->offset, it->reply_length, true);
  }
  EXPECT(done.Wait() && done_calls == 1);
  for (size_t i = 0; i < kCount; ++i)
    if (device_output[i] != 2.0f * static_cast<float>(i) + 1.0f) {
      EXPECT(device_output[i] == 2.0f * static_cast<float>(i) + 1.0f);
      break;
    }
  EXPECT(device_input[kCount - 1] == static_cast<float>(kCount - 1));  // the caller's, untouched
  devices->api().stream_destroy(0, caller);
  DrainCompletions(devices.get());
}

void TestARefusedPieceDropsWhatItHadNotSent() {
  auto devices = std::make_shared<Devices>(HostStandInDevice());
  constexpr size_t kCount = 1000, kPiece = 400;  // bytes: 10 pieces
  std::vector<float> device_tensor(kCount, 1.0f);
  TaskSpec spec;
  spec.op.name = "refused";
  spec.op.kind = OpKind::kPushPull;
  spec.op.dtype = DataType::kFloat32;
  spec.op.shape = {static_cast<int64_t>(kCount)};
  spec.input = spec.output = device_tensor.data();
  spec.bytes = kCount * sizeof(float);
  spec.place.device = 0;
  AllocateFn allocate;
  std::shared_ptr<DeviceStaging> staging;
  EXPECT(DeviceStaging::Prepare(devices, &spec, &allocate, &staging).ok());
  const char* host = static_cast<const char*>(spec.input);
  Group group;
  group.ranks = {0};
  Latch done;
  std::string failure;
  auto task = std::make_shared<Task>(spec, group, 2, 0, 1, 10000, allocate,
                                     [&](const Status& status) {
                                       failure = status.message();
                                       done.Set();
                                     });
  task->set_staging(staging);
  std::atomic<int> sent{0}, dropped{0};
  DeviceStaging::Route route;
  route.send = [&](PartitionTask) { ++sent; };
  route.drop = [&](const PartitionTask&) { ++dropped; };
  route.check = [&](const char* data, size_t) {
    return data - host < static_cast<ptrdiff_t>(5 * kPiece) ? Status::OK()
                                                            : Status::Error("piece refused");
  };
  task->Launch(10);
  EXPECT(staging->StageInput(task, kPiece, nullptr, route).ok());
  for (uint32_t part = 0; part < 10; ++part)
    staging->Release(
        MakePartition(task, part, part * kPiece, host + part * kPiece, kPiece, kPiece));
  EXPECT(done.Wait() && failure == "piece refused");
  for (int i = 0; i < 200 && sent + dropped < 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Pieces 5 on never leave; earlier ones leave unless the refusal came first.
  EXPECT(sent + dropped == 10 && sent <= 5 && dropped >= 5);
  DrainCompletions(devices.get());
}

// Two members, each on a thread of its own (as two processes would be): a sum and a
// broadcast longer than the group's chunk, a min, then a member that never comes.
void TestStandInGroupCollectives() {
  char id[BPS_GROUP_ID_BYTES];
  HostGroup::MakeId(id);
  const size_t count = 300000;  // floats: more than one 1 MiB chunk
  std::vector<float> inputs[2], sums(count, 0), shared[2];
  std::vector<int32_t> mins[2];
  Status results[2] = {Status::OK(), Status::OK()};
  auto member = [&](int m) {
    HostGroup* group = nullptr;
    results[m] = HostGroup::Open(id, 2, m, std::chrono::seconds(30), &group);
    if (!results[m].ok()) return;
    inputs[m].assign(count, static_cast<float>(m + 1));
    inputs[m][count - 1] = 10.0f * static_cast<float>(m);
    Status status = group->Reduce(inputs[m].data(), sums.data(), count, DataType::kFloat32,
                                  ReduceOp::kSum, 1);
    shared[m].assign(count, m == 0 ? 7.0f : 0.0f);
    if (status.ok()) status = group->Broadcast(shared[m].data(), count, DataType::kFloat32, 0);
    mins[m] = {3 + m, -m};
    if (status.ok())
      status = group->Reduce(mins[m].data(), mins[m].data(), 2, DataType::kInt32,
                             ReduceOp::kMin, 0);
    results[m] = status;
    delete group;
  };
  std::thread first(member, 0), second(member, 1);
  first.join();
  second.join();
  EXPECT(results[0].ok() && results[1].ok());
  EXPECT(sums[0] == 3.0f && sums[count / 2] == 3.0f && sums[count - 1] == 10.0f);
  EXPECT(shared[1][0] == 7.0f && shared[1][count - 1] == 7.0f);
  EXPECT(mins[0][0] == 3 && mins[0][1] == -1);

  // Member 1 never opens: member 0 gives up after its wait, naming the step.
  HostGroup::MakeId(id);
  HostGroup* alone = nullptr;
  Status status = HostGroup::Open(id, 2, 0, std::chrono::milliseconds(200), &alone);
  EXPECT(!status.ok() && status.message().find("waited 200 ms for the others opening") !=
                             std::string::npos);
}

}  // namespace

void TestDeviceStaging() {
  TestPinnedPoolReusesAndStaysBounded();
  TestStagingSendsEachPartitionOnceItsPieceIsOnTheHost();
  TestARefusedPieceDropsWhatItHadNotSent();
  TestStandInGroupCollectives();
}

}  // namespace bps
