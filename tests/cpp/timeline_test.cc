// Unit tests of the communication timeline (custom_ops/worker/timeline.h): a window of
// steps (BYTEPS_TRACE_ON), recordings started and stopped at run time (Horovod's
// start_timeline and stop_timeline) and switched while operations run, and events of
// a recording whose file is written are dropped.
#include "../../custom_ops/worker/timeline.h"

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "expect.h"

namespace bps {
namespace {

using std::chrono::milliseconds;

// A folder of its own under /tmp, emptied and removed at the end.
class TempFolder {
 public:
  TempFolder() { EXPECT(::mkdtemp(path_) != nullptr); }
  ~TempFolder() {
    if (DIR* dir = ::opendir(path_)) {
      while (const dirent* entry = ::readdir(dir))
        if (entry->d_name[0] != '.') ::unlink(File(entry->d_name).c_str());
      ::closedir(dir);
    }
    ::rmdir(path_);
  }
  std::string File(const std::string& name) const { return std::string(path_) + "/" + name; }

 private:
  char path_[32] = "/tmp/bps_timeline_XXXXXX";
};

std::string ReadWhole(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The file once it is written (it appears whole: written aside, then renamed).
std::string WaitForFile(const std::string& path) {
  for (int i = 0; i < 500; ++i) {
    const std::string text = ReadWhole(path);
    if (!text.empty()) return text;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return "";
}

int Count(const std::string& text, const std::string& part) {
  int count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

// The whole operation on `tensor` and its `stage`, as written.
std::string Total(const std::string& tensor) {
  return "\"name\": \"Comm." + tensor + "\", \"ts\":";
}
std::string StageOf(const std::string& tensor, const std::string& stage) {
  return "\"name\": \"Comm." + tensor + "." + stage + "\"";
}

}  // namespace

void TestTimelineWindow() {
  TempFolder folder;
  const std::string path = folder.File("comm.json");
  {
    Timeline timeline;
    const uint32_t window = timeline.Start(path, 2, 3);
    EXPECT(window != 0);
    EXPECT(timeline.OperationStarted(1) == 0);  // before the window: not recorded
    EXPECT(timeline.OperationStarted(2) == window);
    timeline.Stage(window, "w\"1", 2, 0, "PUSH", 100, 150);
    EXPECT(timeline.OperationStarted(4) == 0);  // a later step began, but step 2 is open...
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT(ReadWhole(path).empty());
    timeline.OperationEnded(window, "w\"1", 2, 90);  // ...and now the window is over: written
    EXPECT(!WaitForFile(path).empty());
    EXPECT(timeline.OperationStarted(3) == 0);           // the window took its last
    timeline.Stage(window, "late", 3, 0, "PUSH", 1, 2);  // after writing: dropped
  }
  const std::string text = ReadWhole(path);
  // Names are JSON-escaped; the stage event names its partition, the whole one "total".
  EXPECT(text.find("\"name\": \"Comm.w\\\"1.PUSH\", \"ts\": 100, \"dur\": 50, \"tid\": \"0\"") !=
         std::string::npos);
  EXPECT(text.find("\"tid\": \"total\"") != std::string::npos);
  EXPECT(text.find("\"step\": 2") != std::string::npos);
  EXPECT(text.find("late") == std::string::npos);
  EXPECT(text.rfind("\n]}\n") == text.size() - 4);
}

void TestTimelineRecordings() {
  TempFolder folder;
  const std::string a = folder.File("a.json"), b = folder.File("b.json");
  Timeline timeline;
  EXPECT(timeline.OperationStarted(1) == 0);  // nothing records
  EXPECT(timeline.Stop(milliseconds(0)));     // not recording: nothing to do
  const uint32_t first = timeline.Start(a);
  EXPECT(first != 0);
  EXPECT(timeline.OperationStarted(7) == first);  // any step
  EXPECT(timeline.OperationStarted(8) == first);
  timeline.Stage(first, "x", 7, 0, "PUSH", 10, 20);
  timeline.OperationEnded(first, "x", 7, 5);
  // Started again while "y" of the first recording runs: files switch, and y's events
  // still go to the first file, which is written once y has ended.
  const uint32_t second = timeline.Start(b);
  EXPECT(second != 0 && second != first);
  EXPECT(timeline.OperationStarted(9) == second);
  timeline.Stage(first, "y", 8, 1, "PULL", 30, 40);
  timeline.Stage(second, "z", 9, 0, "PUSH", 50, 60);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT(ReadWhole(a).empty());
  timeline.OperationEnded(first, "y", 8, 25);
  const std::string in_a = WaitForFile(a);
  timeline.Stage(first, "late", 8, 0, "PUSH", 1, 2);  // its file is written: dropped
  timeline.OperationEnded(second, "z", 9, 45);
  EXPECT(timeline.Stop(milliseconds(5000)));  // returns once b is written
  const std::string in_b = ReadWhole(b);
  EXPECT(timeline.OperationStarted(10) == 0);  // stopped: nothing records
  timeline.Stage(second, "after", 9, 0, "PUSH", 1, 2);
  EXPECT(timeline.Stop(milliseconds(0)));  // again: nothing to do

  EXPECT(Count(in_a, "\"ph\"") == 4);
  EXPECT(Count(in_a, Total("x")) == 1 && Count(in_a, StageOf("x", "PUSH")) == 1);
  EXPECT(Count(in_a, Total("y")) == 1 && Count(in_a, StageOf("y", "PULL")) == 1);
  EXPECT(in_a.find("\"name\": \"Comm.y.PULL\", \"ts\": 30, \"dur\": 10, \"tid\": \"1\"") !=
         std::string::npos);
  EXPECT(in_a.find("\"step\": 8") != std::string::npos);
  EXPECT(Count(in_b, "\"ph\"") == 2);
  EXPECT(Count(in_b, Total("z")) == 1 && Count(in_b, StageOf("z", "PUSH")) == 1);
  EXPECT(ReadWhole(b) == in_b);  // nothing more was written after stopping
  EXPECT(Count(in_a + in_b, "late") == 0 && Count(in_a + in_b, "after") == 0);

  // Stop waits for the operations it took no longer than it is told; the file follows.
  const std::string c = folder.File("c.json");
  const uint32_t third = timeline.Start(c);
  EXPECT(timeline.OperationStarted(1) == third);
  const auto began = std::chrono::steady_clock::now();
  EXPECT(!timeline.Stop(milliseconds(100)));
  EXPECT(std::chrono::steady_clock::now() - began >= milliseconds(100));
  EXPECT(ReadWhole(c).empty());
  timeline.OperationEnded(third, "w", 1, 0);
  EXPECT(Count(WaitForFile(c), Total("w")) == 1);

  // A switch waits for the old file as Stop does, and the new recording takes every
  // operation meanwhile.
  const std::string e = folder.File("e.json"), f = folder.File("f.json");
  const uint32_t fifth = timeline.Start(e);
  EXPECT(timeline.OperationStarted(1) == fifth);
  std::thread ender([&] {
    std::this_thread::sleep_for(milliseconds(50));
    timeline.OperationEnded(fifth, "u", 1, 0);
  });
  const uint32_t sixth = timeline.Start(f, 1, Timeline::kEveryStep, milliseconds(5000));
  EXPECT(Count(ReadWhole(e), Total("u")) == 1);  // written before Start returned
  ender.join();
  EXPECT(timeline.OperationStarted(2) == sixth);
  timeline.OperationEnded(sixth, "s", 2, 0);

  // Finish (shutdown) writes what is recording, operations still open or not; no
  // recording begins afterwards.
  const std::string d = folder.File("d.json");
  const uint32_t fourth = timeline.Start(d);
  EXPECT(timeline.OperationStarted(1) == fourth);
  timeline.Stage(fourth, "v", 1, 0, "PUSH", 1, 2);
  timeline.Finish();
  EXPECT(Count(ReadWhole(f), Total("s")) == 1);
  EXPECT(Count(ReadWhole(d), StageOf("v", "PUSH")) == 1);
  EXPECT(timeline.Start(folder.File("g.json")) == 0);
  EXPECT(timeline.OperationStarted(1) == 0);
}

// Operations on several threads while recordings switch: every file is whole, and each
// operation's stage lies in the file of its total or in none.
void TestTimelineSwitchesUnderLoad() {
  TempFolder folder;
  Timeline timeline;
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string tensor = "t" + std::to_string(t);
      for (uint32_t step = 1; !done.load(); ++step) {
        const uint32_t recording = timeline.OperationStarted(step);
        if (!recording) continue;
        timeline.Stage(recording, tensor, step, 0, "PUSH", 1, 2);
        timeline.OperationEnded(recording, tensor, step, 1);
      }
    });
  }
  constexpr int kFiles = 20;
  for (int i = 0; i < kFiles; ++i) {
    timeline.Start(folder.File(std::to_string(i) + ".json"));
    std::this_thread::sleep_for(milliseconds(2));
    if (i % 2) EXPECT(timeline.Stop(milliseconds(5000)));
  }
  done = true;
  for (std::thread& thread : threads) thread.join();
  timeline.Finish();
  for (int i = 0; i < kFiles; ++i) {
    const std::string text = ReadWhole(folder.File(std::to_string(i) + ".json"));
    EXPECT(text.rfind("\n]}\n") == text.size() - 4);
    EXPECT(Count(text, "\"tid\": \"total\"") == Count(text, ".PUSH\""));
  }
}

}  // namespace bps
