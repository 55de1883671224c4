// The variables of tf_bps as the native code reads them: every entry of settings.def
// (beside this file), the table tf_bps/runtime/config.py reads too, checked with the
// same rules and the same messages, so an operator gets one answer whichever side
// parses a job's environment. The server reads its environment; a worker engine reads
// what its config.py read (FromEntries), never the environment itself.
#ifndef TF_BPS_CONTROL_SETTINGS_H_
#define TF_BPS_CONTROL_SETTINGS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "../common/common.h"

namespace bps {

class Settings {
 public:
  // Where values come from: getenv, or a map in tests. Null or "" means unset.
  using Lookup = std::function<const char*(const char* name)>;

  // Reads and checks every variable of the table, then the rules that tie several
  // together (heartbeat interval and timeout, trace steps, worker id). The first
  // bad one fails with config.py's message for it.
  static Status Read(const Lookup& lookup, Settings* out);
  static Status FromEnvironment(Settings* out);
  // Reads the table from `entries`, NAME=value each: the variables a process's
  // config.py read from its environment, handed to the worker engine (which reads no
  // environment of its own). A name given twice, or one that neither the table nor
  // its rules read, fails naming it.
  static Status FromEntries(const std::vector<std::string>& entries, Settings* out);
  // The table's defaults, as a process with none of its variables set reads them.
  static Settings Defaults();

  // BYTEPS_OP_TIMEOUT, or else GLOO_TIMEOUT_SECONDS: how long any one wait may last.
  double OperationTimeout() const;

  // The value, or the table's default when unset. Int: -1 for an unset variable
  // without default. Number: seconds too. Text: choices too.
  int64_t Int(const std::string& name) const;
  double Number(const std::string& name) const;
  bool Flag(const std::string& name) const;
  const std::string& Text(const std::string& name) const;
  // Whether the environment set it (not just its default).
  bool IsSet(const std::string& name) const;

 private:
  struct Value {
    bool set = false;
    int64_t integer = -1;
    double number = 0;
    std::string text;
  };
  const Value& Get(const std::string& name) const;

  std::map<std::string, Value> values_;
};

// Python's repr() of a string, as config.py's messages quote values: 'text'.
std::string PythonRepr(const std::string& text);
// Python's "%g" of a number.
std::string FormatG(double value);

}  // namespace bps

#endif  // TF_BPS_CONTROL_SETTINGS_H_
