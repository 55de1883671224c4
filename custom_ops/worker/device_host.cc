// Host memory standing in for a device: the staging pipeline's logic (pinned pool,
// the order of partition copies, callbacks, the caller's stream) runs and is tested
// on machines without a GPU, with the same table the CUDA library provides.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "../common/reduce.h"
#include "device.h"
#include "device_host_group.h"

namespace bps {
namespace {

// A stream: a thread that runs queued work in order, as a device runs a stream's.
class HostStream {
 public:
  HostStream() : thread_([this] { Run(); }) {}
  ~HostStream() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void Queue(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      work_.push_back(std::move(work));
    }
    cv_.notify_all();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [this] { return closed_ || !work_.empty(); });
      if (work_.empty()) return;  // closed, and everything queued has run
      std::function<void()> work = std::move(work_.front());
      work_.pop_front();
      lock.unlock();
      work();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> work_;
  bool closed_ = false;
  std::thread thread_;
};

// Null is the default stream: whatever it was given has run already.
void Run(void* stream, std::function<void()> work) {
  if (stream) {
    static_cast<HostStream*>(stream)->Queue(std::move(work));
  } else {
    work();
  }
}

thread_local std::string host_error;

const char* LastError() { return host_error.c_str(); }

int StreamCreate(int, void** stream) {
  *stream = new HostStream;
  return 0;
}

void StreamDestroy(int, void* stream) { delete static_cast<HostStream*>(stream); }

int StreamWait(int, void* waiter, void* stream) {
  if (!waiter || !stream) return 0;
  auto reached = std::make_shared<std::promise<void>>();
  std::shared_future<void> when = reached->get_future().share();
  Run(stream, [reached] { reached->set_value(); });
  Run(waiter, [when] { when.wait(); });
  return 0;
}

int Copy(int, void* dst, const void* src, size_t bytes, void* stream) {
  Run(stream, [=] { std::memmove(dst, src, bytes); });
  return 0;
}

// Queues `work` on the elements of `dtype`, which must be one with arithmetic.
int Arithmetic(int dtype, void* stream, std::function<void(DataType)> work) {
  if (!IsValidDataType(static_cast<uint8_t>(dtype))) {
    host_error = "data type " + std::to_string(dtype) + " has no arithmetic";
    return -1;
  }
  Run(stream, [=] { work(static_cast<DataType>(dtype)); });
  return 0;
}

int Scale(int, void* buf, size_t count, int dtype, double factor, void* stream) {
  return Arithmetic(dtype, stream, [=](DataType type) { ScaleInPlace(type, buf, count, factor); });
}

int Divide(int, void* buf, size_t count, int dtype, int divisor, void* stream) {
  return Arithmetic(dtype, stream,
                    [=](DataType type) { DivideInPlace(type, buf, count, divisor); });
}

int CallWhenDone(int, void* stream, void (*fn)(void*), void* arg) {
  Run(stream, [=] { fn(arg); });
  return 0;
}

int HostAlloc(int, size_t bytes, void** ptr) {
  *ptr = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (*ptr) return 0;
  host_error = "out of memory";
  return -1;
}

void HostFree(int, void* ptr) { std::free(ptr); }

// Stand-in device N is the same one in every process of the host, as GPU N would be:
// workers on one ordinal share a device.
int DeviceKey(int device, char* key, size_t size) {
  std::snprintf(key, size, "host stand-in device %d", device);
  return 0;
}

int GroupId(void* id) {
  HostGroup::MakeId(id);
  return 0;
}

// A group handle: queued collectives hold the group too, so closing it never pulls
// it from under them.
using GroupHandle = std::shared_ptr<HostGroup>;

GroupHandle& GroupOf(void* group) { return *static_cast<GroupHandle*>(group); }

int GroupOpen(int, const void* id, int size, int member, void** group) {
  HostGroup* opened = nullptr;
  Status status = HostGroup::Open(id, size, member, std::chrono::minutes(2), &opened);
  if (!status.ok()) {
    host_error = status.message();
    return -1;
  }
  *group = new GroupHandle(opened);
  return 0;
}

void GroupClose(int, void* group, int abort) {
  if (abort) GroupOf(group)->Abort();
  delete static_cast<GroupHandle*>(group);
}

int GroupCheck(int, void* group) {
  host_error = GroupOf(group)->broken();
  return host_error.empty() ? 0 : -1;
}

int GroupHasDtype(int dtype) {
  return IsValidDataType(static_cast<uint8_t>(dtype)) && CanReduce(static_cast<DataType>(dtype));
}

int GroupReduce(int, const void* src, void* dst, size_t count, int dtype, int reduce_op, int root,
                void* group, void* stream) {
  Run(stream, [=, held = GroupOf(group)] {
    // A failure breaks the group: GroupCheck says so.
    held->Reduce(src, dst, count, static_cast<DataType>(dtype), static_cast<ReduceOp>(reduce_op),
                 root);
  });
  return 0;
}

int GroupBroadcast(int, void* buf, size_t count, int dtype, int root, void* group, void* stream) {
  Run(stream, [=, held = GroupOf(group)] {
    held->Broadcast(buf, count, static_cast<DataType>(dtype), root);
  });
  return 0;
}

int GroupCall() { return 0; }  // collectives run one by one, in the order queued

const bps_device_api kHostStandIn = {
    "host stand-in", LastError,     StreamCreate, StreamDestroy, StreamWait,    Copy,
    Scale,           Divide,        CallWhenDone, HostAlloc,     HostFree,      DeviceKey,
    GroupId,         GroupOpen,     GroupClose,   GroupHasDtype, GroupReduce,   GroupBroadcast,
    GroupCheck,      GroupCall,     GroupCall};

}  // namespace

const bps_device_api* HostStandInDevice() { return &kHostStandIn; }

}  // namespace bps
