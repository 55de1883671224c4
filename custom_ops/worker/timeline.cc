#include "timeline.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <utility>

#include "../common/logging.h"

namespace bps {
namespace {

// A JSON string literal of `text`.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

Timeline::~Timeline() { Finish(); }

int64_t Timeline::Now() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint32_t Timeline::Start(std::string path, uint32_t first, uint32_t last,
                         std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_) return 0;
  const uint32_t previous = current_.load(std::memory_order_relaxed);
  if (++last_id_ == 0) ++last_id_;  // 0 means "not traced"
  const uint32_t id = last_id_;
  recordings_.push_back(Recording{id, std::move(path), first, last, {}});
  current_.store(id, std::memory_order_release);
  // Horovod's start_timeline while one records switches files: the new recording takes
  // the operations from now on (no gap between the two), the old one is finished.
  Recording* old = FindLocked(previous);
  if (!old) return id;
  const std::string old_path = old->path;
  CloseLocked(old);
  if (wait.count() > 0) AwaitLocked(lock, previous, old_path, wait);
  return id;
}

bool Timeline::Stop(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint32_t id = current_.load(std::memory_order_relaxed);
  Recording* current = FindLocked(id);
  if (!current) return true;
  const std::string path = current->path;
  CloseLocked(current);
  return AwaitLocked(lock, id, path, wait);
}

bool Timeline::AwaitLocked(std::unique_lock<std::mutex>& lock, uint32_t id, const std::string& path,
                           std::chrono::milliseconds wait) {
  if (written_.wait_for(lock, wait, [&] { return WrittenLocked(id); })) return true;
  BPS_LOG(kWarning) << "operations recorded into the timeline " << path
                    << " are still in flight; the file is written once they end";
  return false;
}

uint32_t Timeline::OperationStarted(uint32_t step) {
  if (current_.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  Recording* current = FindLocked(current_.load(std::memory_order_relaxed));
  if (!current) return 0;
  if (step >= current->first && step <= current->last) {
    ++current->open_operations;
    return current->id;
  }
  // A later step began: the window is over once its operations have ended.
  if (step > current->last) CloseLocked(current);
  return 0;
}

void Timeline::OperationEnded(uint32_t recording, const std::string& tensor, uint32_t step,
                              int64_t start) {
  std::lock_guard<std::mutex> lock(mutex_);
  Recording* taken = FindLocked(recording);
  if (!taken) return;  // Its file is on its way (written at shutdown, say).
  taken->events.push_back(Event{tensor, nullptr, step, 0, start, Now() - start});
  if (--taken->open_operations == 0 && taken->closed) QueueFileLocked(recording);
}

void Timeline::Stage(uint32_t recording, const std::string& tensor, uint32_t step, uint32_t part,
                     const char* stage, int64_t start, int64_t end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Recording* taken = FindLocked(recording))
    taken->events.push_back(Event{tensor, stage, step, part, start, end - start});
}

void Timeline::Finish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_.store(0, std::memory_order_release);
    while (!recordings_.empty()) QueueFileLocked(recordings_.front().id);
    finished_ = true;
  }
  queued_.notify_all();
  if (writer_.joinable()) writer_.join();
}

Timeline::Recording* Timeline::FindLocked(uint32_t id) {
  if (id == 0) return nullptr;
  for (Recording& recording : recordings_)
    if (recording.id == id) return &recording;
  return nullptr;
}

void Timeline::CloseLocked(Recording* recording) {
  recording->closed = true;
  if (current_.load(std::memory_order_relaxed) == recording->id)
    current_.store(0, std::memory_order_release);
  if (recording->open_operations == 0) QueueFileLocked(recording->id);
}

void Timeline::QueueFileLocked(uint32_t id) {
  for (auto it = recordings_.begin(); it != recordings_.end(); ++it) {
    if (it->id != id) continue;
    files_.push_back(File{id, std::move(it->path), std::move(it->events)});
    recordings_.erase(it);
    break;
  }
  if (!writer_.joinable()) writer_ = std::thread([this] { WriterLoop(); });
  queued_.notify_one();
}

bool Timeline::WrittenLocked(uint32_t id) const {
  if (writing_ == id) return false;
  for (const Recording& recording : recordings_)
    if (recording.id == id) return false;
  for (const File& file : files_)
    if (file.id == id) return false;
  return true;
}

void Timeline::WriterLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return !files_.empty() || finished_; });
    if (files_.empty()) return;  // finished, and everything is written
    File file = std::move(files_.front());
    files_.pop_front();
    writing_ = file.id;
    lock.unlock();
    Write(file.path, file.events);
    file = File{};  // Its memory goes before the next file's.
    lock.lock();
    writing_ = 0;
    written_.notify_all();
  }
}

void Timeline::Write(const std::string& path, const std::vector<Event>& events) {
  // Written aside and renamed: whoever reads the file sees it whole, and workers of a
  // host given the same path (Horovod scripts call start_timeline on every rank) leave
  // one complete timeline rather than a mixture.
  const std::string aside = path + "." + std::to_string(::getpid()) + ".tmp";
  std::FILE* file = std::fopen(aside.c_str(), "w");
  if (!file) {
    BPS_LOG(kWarning) << "cannot write the timeline to " << path;
    return;
  }
  std::fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [", file);
  bool first = true;
  for (const Event& event : events) {
    const std::string process = Quoted("Comm." + event.tensor);
    const std::string name =
        event.stage ? Quoted("Comm." + event.tensor + "." + event.stage) : process;
    const std::string thread = event.stage ? Quoted(std::to_string(event.part)) : "\"total\"";
    std::fprintf(file,
                 "%s\n{\"ph\": \"X\", \"args\": {\"name\": %s, \"step\": %u}, \"pid\": %s, "
                 "\"name\": %s, \"ts\": %lld, \"dur\": %lld, \"tid\": %s}",
                 first ? "" : ",", process.c_str(), event.step, process.c_str(), name.c_str(),
                 static_cast<long long>(event.start), static_cast<long long>(event.duration),
                 thread.c_str());
    first = false;
  }
  std::fputs("\n]}\n", file);
  if (std::fclose(file) != 0 || std::rename(aside.c_str(), path.c_str()) != 0) {
    BPS_LOG(kWarning) << "cannot write the timeline to " << path;
    std::remove(aside.c_str());
    return;
  }
  BPS_LOG(kInfo) << "wrote " << events.size() << " timeline events to " << path;
}

}  // namespace bps
