// Host memory standing in for a device: the staging pipeline's logic (pinned pool,
// the order of partition copies, callbacks, the caller's stream) runs and is tested
// on machines without a GPU, with the same table the CUDA library provides.
#include <condition_variable>
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

int Scale(int, void* buf, size_t count, int dtype, double factor, void* stream) {
  if (!IsValidDataType(static_cast<uint8_t>(dtype))) {
    host_error = "data type " + std::to_string(dtype) + " has no arithmetic";
    return -1;
  }
  Run(stream, [=] { ScaleInPlace(static_cast<DataType>(dtype), buf, count, factor); });
  return 0;
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

const bps_device_api kHostStandIn = {"host stand-in", LastError, StreamCreate, StreamDestroy,
                                     StreamWait,      Copy,      Scale,        CallWhenDone,
                                     HostAlloc,       HostFree};

}  // namespace

const bps_device_api* HostStandInDevice() { return &kHostStandIn; }

}  // namespace bps
