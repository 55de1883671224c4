#include "logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
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

// This machine's name, read once: every line says where it was written.
const std::string& Hostname() {
  static const std::string name = [] {
    char text[256] = {};
    return gethostname(text, sizeof(text) - 1) == 0 ? std::string(text) : std::string("?");
  }();
  return name;
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

std::string Printable(const std::string& text, size_t max_bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < text.size() && i < max_bytes; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f && byte != '\\') {
      out += static_cast<char>(byte);
    } else {
      out += {'\\', 'x', kDigits[byte >> 4], kDigits[byte & 15]};
    }
  }
  if (text.size() > max_bytes) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

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
  // Local time to the millisecond, as Python's lines of the same process have it.
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm local{};
  localtime_r(&now.tv_sec, &local);
  char stamp[32];
  strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &local);
  // One fprintf per line so that lines of concurrent threads do not interleave.
  std::fprintf(stderr, "[%s.%03ld %s on %s %s] %s\n", stamp, now.tv_nsec / 1000000, prefix.c_str(),
               Hostname().c_str(), LevelName(level_), stream_.str().c_str());
}

}  // namespace bps
