// The little JSON the control plane speaks (the scheduler's messages, tf_bps/
// runtime/rendezvous.py): parse one message into a tree, and write flat objects. Input comes
// off the network, so parsing bounds its depth and refuses anything malformed.
#ifndef TF_BPS_CONTROL_JSON_H_
#define TF_BPS_CONTROL_JSON_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../common/common.h"

namespace bps {

class Json {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  // Parses a whole document; trailing bytes, nesting deeper than 32 and malformed
  // text are errors.
  static Status Parse(const std::string& text, Json* out);

  Type type() const { return type_; }
  // The string (empty unless a string).
  const std::string& str() const { return text_; }
  // The elements (empty unless an array).
  const std::vector<Json>& items() const { return items_; }
  // An object's member; a null value when absent or not an object.
  const Json& operator[](const std::string& key) const;
  // Whether this is an integer (not a bool) from `low` to `high`; writes it.
  bool AsInt(int64_t low, int64_t high, int64_t* value) const;

 private:
  class Parser;

  Type type_ = Type::kNull;
  bool boolean_ = false;
  double number_ = 0;
  std::string text_;
  std::vector<Json> items_;
  std::map<std::string, Json> members_;
};

// A flat JSON object, written field by field: {"type": "hello", "nonce": "..."}.
class JsonWriter {
 public:
  JsonWriter& Add(const std::string& key, const std::string& value);
  JsonWriter& Add(const std::string& key, const char* value) {
    return Add(key, std::string(value));
  }
  JsonWriter& Add(const std::string& key, int64_t value);
  std::string Finish() const { return "{" + body_ + "}"; }

 private:
  void Key(const std::string& key);
  std::string body_;
};

// A JSON string literal of `text` (quotes and escapes added).
std::string JsonQuote(const std::string& text);

}  // namespace bps

#endif  // TF_BPS_CONTROL_JSON_H_
