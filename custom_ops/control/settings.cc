#include "settings.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bps {
namespace {

enum class Kind { kInt, kNumber, kSeconds, kFlag, kRefused, kChoice, kText };

struct Entry {
  Kind kind;
  const char* name;
  const char* default_value;  // as the table writes it; "" for none
  double minimum;
  double maximum;
  const char* choices;  // '|'-separated
  bool any_case;
  const char* reason;  // why 1 is refused
};

// clang-format off
#define BPS_INT(name, def, lo, hi) {Kind::kInt, name, def, lo, hi, "", false, ""},
#define BPS_NUMBER(name, def, lo, hi) {Kind::kNumber, name, def, lo, hi, "", false, ""},
#define BPS_SECONDS(name, def, hi) {Kind::kSeconds, name, def, 0, hi, "", false, ""},
#define BPS_FLAG(name, def) {Kind::kFlag, name, (def) ? "1" : "0", 0, 1, "", false, ""},
#define BPS_REFUSED(name, why) {Kind::kRefused, name, "0", 0, 1, "", false, why},
#define BPS_CHOICE(name, def, options, any_case) \
  {Kind::kChoice, name, def, 0, 0, options, (any_case) != 0, ""},
#define BPS_TEXT(name, def) {Kind::kText, name, def, 0, 0, "", false, ""},
constexpr Entry kTable[] = {
#include "settings.def"
};
#undef BPS_INT
#undef BPS_NUMBER
#undef BPS_SECONDS
#undef BPS_FLAG
#undef BPS_REFUSED
#undef BPS_CHOICE
#undef BPS_TEXT
// clang-format on

std::string Strip(const char* raw) {
  std::string text = raw ? raw : "";
  const char* space = " \t\n\r\v\f";
  size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

// Python's int() and float() allow one underscore between two digits ("1_000").
bool WithoutDigitUnderscores(const std::string& text, std::string* out) {
  out->clear();
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '_') {
      out->push_back(text[i]);
      continue;
    }
    if (i == 0 || i + 1 == text.size() || !isdigit(static_cast<unsigned char>(text[i - 1])) ||
        !isdigit(static_cast<unsigned char>(text[i + 1])))
      return false;
  }
  return true;
}

// As Python's int(text): an optional sign and decimal digits.
bool ParseInteger(const std::string& raw, int64_t* value) {
  std::string text;
  if (!WithoutDigitUnderscores(raw, &text)) return false;
  size_t digits = (text[0] == '+' || text[0] == '-') ? 1 : 0;
  if (digits == text.size()) return false;
  for (size_t i = digits; i < text.size(); ++i)
    if (!isdigit(static_cast<unsigned char>(text[i]))) return false;
  errno = 0;
  long long parsed = strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE) return false;  // Beyond any range in the table either way.
  *value = parsed;
  return true;
}

// As Python's float(text); NaN where it is not a number (no range accepts NaN).
double ParseNumber(const std::string& raw) {
  std::string text;
  // strtod also reads hexadecimal and "nan(...)", which Python refuses.
  if (!WithoutDigitUnderscores(raw, &text) || text.find_first_of("xX()") != std::string::npos)
    return NAN;
  char* end = nullptr;
  double value = strtod(text.c_str(), &end);
  return *end == '\0' ? value : NAN;
}

std::string Invalid(const Entry& entry, const std::string& raw, const std::string& expected) {
  return std::string(entry.name) + "=" + PythonRepr(raw) + " is not valid: expected " + expected;
}

std::string ChoicesList(const char* choices) {
  std::string list = choices;
  for (size_t at = list.find('|'); at != std::string::npos; at = list.find('|', at))
    list.replace(at, 1, ", ");
  return list;
}

bool IsChoice(const char* choices, const std::string& value) {
  if (value.find('|') != std::string::npos) return false;  // The table's separator.
  std::string all = std::string("|") + choices + "|";
  return all.find("|" + value + "|") != std::string::npos;
}

const Entry& TableEntry(const char* name) {
  for (const Entry& entry : kTable)
    if (strcmp(entry.name, name) == 0) return entry;
  fprintf(stderr, "tf_bps: %s is not in settings.def\n", name);
  abort();
}

std::string Lowered(std::string text) {
  for (char& c : text) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return text;
}

// How many GPUs NVIDIA_VISIBLE_DEVICES (or else CUDA_VISIBLE_DEVICES) lists, as
// config.py's visible_gpus(): none when unset or none/void/-1; "all" is refused.
Status VisibleGpus(const Settings::Lookup& lookup, int64_t* count) {
  *count = 0;
  for (const char* name : {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}) {
    std::string raw = Strip(lookup(name));
    if (raw.empty()) continue;
    std::string lowered = Lowered(raw);
    if (lowered == "none" || lowered == "void" || lowered == "-1") return Status::OK();
    if (lowered == "all")
      return Status::Error(ErrorKind::kInvalidArgument,
                           std::string(name) +
                               "=all does not say how many GPUs there are: list them (0,1,...) "
                               "or set BYTEPS_LOCAL_SIZE");
    size_t start = 0;
    while (start <= raw.size()) {
      size_t comma = raw.find(',', start);
      if (comma == std::string::npos) comma = raw.size();
      if (!Strip(raw.substr(start, comma - start).c_str()).empty()) ++*count;
      start = comma + 1;
    }
    return Status::OK();
  }
  return Status::OK();
}

// Variables beside the table's that Read's rules consult.
constexpr const char* kRuleVariables[] = {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"};

bool IsKnown(const std::string& name) {
  for (const Entry& entry : kTable)
    if (name == entry.name) return true;
  for (const char* rule : kRuleVariables)
    if (name == rule) return true;
  return false;
}

}  // namespace

std::string PythonRepr(const std::string& text) {
  char quote =
      (text.find('\'') != std::string::npos && text.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : text) {
    if (c == '\\' || c == quote) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char escaped[5];
      snprintf(escaped, sizeof(escaped), "\\x%02x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

std::string FormatG(double value) {
  char text[32];
  snprintf(text, sizeof(text), "%g", value);
  return text;
}

Status Settings::Read(const Lookup& lookup, Settings* out) {
  out->values_.clear();
  for (const Entry& entry : kTable) {
    std::string raw = Strip(lookup(entry.name));
    Value value;
    value.set = !raw.empty();
    const std::string given = value.set ? raw : entry.default_value;
    if (given.empty()) {  // Unset, and no default.
      out->values_[entry.name] = value;
      continue;
    }
    switch (entry.kind) {
      case Kind::kInt: {
        int64_t integer = 0;
        if (!ParseInteger(given, &integer) || integer < entry.minimum || integer > entry.maximum)
          return Status::Error(
              ErrorKind::kInvalidArgument,
              Invalid(entry, raw,
                      "an integer from " + std::to_string(static_cast<int64_t>(entry.minimum)) +
                          " to " + std::to_string(static_cast<int64_t>(entry.maximum))));
        value.integer = integer;
        value.number = static_cast<double>(integer);
        break;
      }
      case Kind::kNumber:
      case Kind::kSeconds: {
        double number = ParseNumber(given);
        bool seconds = entry.kind == Kind::kSeconds;
        // Written so that NaN fails every comparison.
        bool ok = seconds ? (number > 0 && number <= entry.maximum)
                          : (number >= entry.minimum && number <= entry.maximum);
        if (!ok)
          return Status::Error(ErrorKind::kInvalidArgument,
                               Invalid(entry, raw,
                                       seconds ? "a number of seconds greater than 0 and at most " +
                                                     FormatG(entry.maximum)
                                               : "a number from " + FormatG(entry.minimum) +
                                                     " to " + FormatG(entry.maximum)));
        value.number = number;
        break;
      }
      case Kind::kFlag:
      case Kind::kRefused:
        if (given != "0" && given != "1")
          return Status::Error(ErrorKind::kInvalidArgument, Invalid(entry, raw, "0 or 1"));
        if (entry.kind == Kind::kRefused && given == "1")
          return Status::Error(ErrorKind::kInvalidArgument,
                               std::string(entry.name) + "=1 is not supported: " + entry.reason +
                                   "; set it to 0 or unset");
        value.integer = given == "1";
        break;
      case Kind::kChoice: {
        std::string choice = given;
        if (entry.any_case)
          for (char& c : choice) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
        if (!IsChoice(entry.choices, choice))
          return Status::Error(ErrorKind::kInvalidArgument,
                               Invalid(entry, raw, "one of " + ChoicesList(entry.choices)));
        value.text = choice;
        break;
      }
      case Kind::kText:
        value.text = given;
        break;
    }
    out->values_[entry.name] = value;
  }
  // Without BYTEPS_LOCAL_SIZE, a worker host runs one process per visible GPU.
  int64_t local_size = out->Int("BYTEPS_LOCAL_SIZE");
  if (!out->IsSet("BYTEPS_LOCAL_SIZE")) {
    Status status = VisibleGpus(lookup, &local_size);
    if (!status.ok()) return status;
    local_size = std::max<int64_t>(1, local_size);
  }
  if (out->Flag("BYTEPS_ENCRYPT") && out->Text("BYTEPS_JOB_TOKEN").empty())
    return Status::Error(ErrorKind::kInvalidArgument,
                         "BYTEPS_ENCRYPT=1 needs BYTEPS_JOB_TOKEN: the keys are derived from "
                         "the job's token (bpslaunch makes one; set it yourself when you start "
                         "the roles one by one)");
  // The same rule as tf_bps/runtime/config.py's: a short token can be guessed offline
  // against one recorded registration.
  const size_t token_chars = out->Text("BYTEPS_JOB_TOKEN").size();
  if (token_chars > 0 && token_chars < 16 && !out->Flag("BYTEPS_ALLOW_SHORT_TOKEN"))
    return Status::Error(ErrorKind::kInvalidArgument,
                         "BYTEPS_JOB_TOKEN has " + std::to_string(token_chars) +
                             " character(s): it needs at least 16, because anyone who sees one "
                             "registration on the network can try guesses of a short token "
                             "against it offline; use a longer one (bpslaunch makes 32), or set "
                             "BYTEPS_ALLOW_SHORT_TOKEN=1 to accept it anyway");
  double interval = out->Number("PS_HEARTBEAT_INTERVAL");
  double timeout = out->Number("PS_HEARTBEAT_TIMEOUT");
  if (interval >= timeout)
    return Status::Error(
        ErrorKind::kInvalidArgument,
        "PS_HEARTBEAT_INTERVAL=" + FormatG(interval) +
            " is not valid: it must be shorter than PS_HEARTBEAT_TIMEOUT=" + FormatG(timeout) +
            ", or every node would be declared dead between two heartbeats");
  int64_t first = out->Int("BYTEPS_TRACE_START_STEP"), last = out->Int("BYTEPS_TRACE_END_STEP");
  if (last < first)
    return Status::Error(
        ErrorKind::kInvalidArgument,
        "BYTEPS_TRACE_END_STEP=" + std::to_string(last) +
            " is not valid: it comes before BYTEPS_TRACE_START_STEP=" + std::to_string(first));
  int64_t worker_id = out->Int("DMLC_WORKER_ID"), num_worker = out->Int("DMLC_NUM_WORKER");
  const int64_t max_nodes = static_cast<int64_t>(TableEntry("DMLC_NUM_WORKER").maximum);
  if (num_worker * local_size > max_nodes)
    return Status::Error(ErrorKind::kInvalidArgument,
                         "DMLC_NUM_WORKER=" + std::to_string(num_worker) +
                             " x BYTEPS_LOCAL_SIZE=" + std::to_string(local_size) +
                             " is more than " + std::to_string(max_nodes) + " worker processes");
  if (worker_id >= num_worker)
    return Status::Error(ErrorKind::kInvalidArgument,
                         "DMLC_WORKER_ID=" + std::to_string(worker_id) +
                             " is not valid: expected 0 to DMLC_NUM_WORKER-1 (" +
                             std::to_string(num_worker - 1) + ")");
  int64_t local_rank = out->Int("BYTEPS_LOCAL_RANK");
  if (local_rank >= local_size)
    return Status::Error(ErrorKind::kInvalidArgument,
                         "BYTEPS_LOCAL_RANK=" + std::to_string(local_rank) +
                             " is not valid: expected 0 to BYTEPS_LOCAL_SIZE-1 (" +
                             std::to_string(local_size - 1) + ")");
  // BYTEPS_CPU_BLACKLIST and BYTEPS_VISIBLE_CPU_CORES pin the workers bpslaunch
  // starts; config.py alone reads them.
  return Status::OK();
}

Status Settings::FromEnvironment(Settings* out) {
  return Read([](const char* name) { return getenv(name); }, out);
}

Status Settings::FromEntries(const std::vector<std::string>& entries, Settings* out) {
  std::map<std::string, std::string> given;
  for (const std::string& entry : entries) {
    const size_t equals = entry.find('=');
    const std::string name = entry.substr(0, equals);
    if (equals == std::string::npos || name.empty())
      return Status::Error(ErrorKind::kInvalidArgument,
                           "bad setting " + PythonRepr(entry) + ": expected NAME=value");
    if (!IsKnown(name))
      return Status::Error(ErrorKind::kInvalidArgument,
                           name + " is not a variable of settings.def");
    if (!given.emplace(name, entry.substr(equals + 1)).second)
      return Status::Error(ErrorKind::kInvalidArgument, name + " is given twice");
  }
  return Read(
      [&given](const char* name) {
        auto found = given.find(name);
        return found == given.end() ? nullptr : found->second.c_str();
      },
      out);
}

Settings Settings::Defaults() {
  Settings defaults;
  const Status status = Read([](const char*) -> const char* { return nullptr; }, &defaults);
  if (!status.ok()) {  // The table's own defaults break its rules: a bug in settings.def.
    fprintf(stderr, "tf_bps: settings.def's defaults: %s\n", status.message().c_str());
    abort();
  }
  return defaults;
}

double Settings::OperationTimeout() const {
  return IsSet("BYTEPS_OP_TIMEOUT") ? Number("BYTEPS_OP_TIMEOUT")
                                    : Number("GLOO_TIMEOUT_SECONDS");
}

const Settings::Value& Settings::Get(const std::string& name) const {
  auto found = values_.find(name);
  if (found == values_.end()) {
    // A name missing from settings.def is a bug in the caller, not in the input.
    fprintf(stderr, "tf_bps: %s is not in settings.def\n", name.c_str());
    abort();
  }
  return found->second;
}

int64_t Settings::Int(const std::string& name) const { return Get(name).integer; }
double Settings::Number(const std::string& name) const { return Get(name).number; }
bool Settings::Flag(const std::string& name) const { return Get(name).integer == 1; }
const std::string& Settings::Text(const std::string& name) const { return Get(name).text; }
bool Settings::IsSet(const std::string& name) const { return Get(name).set; }

}  // namespace bps
