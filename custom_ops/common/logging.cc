#include "logging.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

namespace bps {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::mutex g_prefix_mutex;
std::string g_prefix = "tf_bps";

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "TRACE";
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void SetLogPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(g_prefix_mutex);
  g_prefix = prefix;
}

LogLine::~LogLine() {
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(g_prefix_mutex);
    prefix = g_prefix;
  }
  // One fprintf per line so that lines of concurrent threads do not interleave.
  std::fprintf(stderr, "[%s %s] %s\n", prefix.c_str(), LevelName(level_), stream_.str().c_str());
}

}  // namespace bps
