#include "timeline.h"

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

Timeline::Timeline(std::string path, uint32_t first, uint32_t last)
    : path_(std::move(path)), first_(first), last_(last) {}

Timeline::~Timeline() { Finish(); }

int64_t Timeline::Now() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Timeline::OperationStarted(uint32_t step) {
  if (written_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (Traces(step)) {
    ++open_operations_;
  } else if (step > last_) {
    past_window_ = true;
    if (open_operations_ == 0) StartWriterLocked();
  }
}

void Timeline::OperationEnded(const std::string& tensor, uint32_t step, int64_t start) {
  if (written_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (written_) return;
  events_.push_back(Event{tensor, nullptr, step, 0, start, Now() - start});
  if (--open_operations_ == 0 && past_window_) StartWriterLocked();
}

void Timeline::Stage(const std::string& tensor, uint32_t step, uint32_t part, const char* stage,
                     int64_t start, int64_t end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!written_) events_.push_back(Event{tensor, stage, step, part, start, end - start});
}

void Timeline::StartWriterLocked() {
  if (written_) return;
  written_.store(true, std::memory_order_release);
  writer_ = std::thread(&Timeline::Write, path_, std::move(events_));
}

void Timeline::Finish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    StartWriterLocked();
  }
  if (writer_.joinable()) writer_.join();
}

void Timeline::Write(const std::string& path, const std::vector<Event>& events) {
  std::FILE* file = std::fopen(path.c_str(), "w");
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
  if (std::fclose(file) != 0) BPS_LOG(kWarning) << "cannot write the timeline to " << path;
  BPS_LOG(kInfo) << "wrote " << events.size() << " timeline events to " << path;
}

}  // namespace bps
