// Leveled logging to stderr. The level is set once through the C API from the
// Python configuration (BYTEPS_LOG_LEVEL, PS_VERBOSE); the core reads no environment.
#ifndef TF_BPS_COMMON_LOGGING_H_
#define TF_BPS_COMMON_LOGGING_H_

#include <sstream>
#include <string>

namespace bps {

enum class LogLevel : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4 };

void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void SetLogPrefix(const std::string& prefix);

// A peer's text made safe for one log line: control and non-ASCII bytes become \xNN,
// and it is cut after `max_bytes` (a stranger's text may be anything, of any length).
std::string Printable(const std::string& text, size_t max_bytes = 300);

class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Turns a streamed LogLine into void, so BPS_LOG can be one expression (safe in if/else).
struct LogVoidify {
  void operator&(LogLine&) {}
};

}  // namespace bps

#define BPS_LOG(level)                       \
  !::bps::LogEnabled(::bps::LogLevel::level) \
      ? (void)0                              \
      : ::bps::LogVoidify() & ::bps::LogLine(::bps::LogLevel::level)

#endif  // TF_BPS_COMMON_LOGGING_H_
