#include "json.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace bps {
namespace {
constexpr int kMaxDepth = 32;
// Bounds the tree a message can build (an address book holds a few per worker).
constexpr size_t kMaxValues = 1 << 16;
}  // namespace

class Json::Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  Status Document(Json* out) {
    if (!Value(out, 0)) return Failure();
    SkipSpace();
    if (at_ != text_.size()) return Failure("trailing bytes");
    return Status::OK();
  }

 private:
  Status Failure(const char* what = nullptr) const {
    return Status::Error(ErrorKind::kInternal,
                         std::string("malformed JSON at byte ") + std::to_string(at_) +
                             (what || error_ ? std::string(": ") + (what ? what : error_) : ""));
  }
  bool Fail(const char* what) {
    error_ = what;
    return false;
  }
  void SkipSpace() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }
  bool Literal(const char* word) {
    size_t length = strlen(word);
    if (text_.compare(at_, length, word) != 0) return Fail("unknown literal");
    at_ += length;
    return true;
  }

  bool Value(Json* out, int depth) {
    if (depth > kMaxDepth) return Fail("nested too deeply");
    if (++values_ > kMaxValues) return Fail("too many values");
    SkipSpace();
    if (at_ >= text_.size()) return Fail("unexpected end");
    char c = text_[at_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') {
      out->type_ = Type::kString;
      return String(&out->text_);
    }
    if (c == 't' || c == 'f') {
      out->type_ = Type::kBool;
      out->boolean_ = c == 't';
      return Literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') return Literal("null");
    return Number(out);
  }

  bool Object(Json* out, int depth) {
    out->type_ = Type::kObject;
    ++at_;
    SkipSpace();
    if (at_ < text_.size() && text_[at_] == '}') return ++at_, true;
    while (true) {
      SkipSpace();
      std::string key;
      if (at_ >= text_.size() || text_[at_] != '"' || !String(&key)) return Fail("expected a key");
      SkipSpace();
      if (at_ >= text_.size() || text_[at_++] != ':') return Fail("expected ':'");
      Json& member = out->members_[key];
      member = Json();  // A repeated key: the last one wins, as in Python.
      if (!Value(&member, depth + 1)) return false;
      SkipSpace();
      if (at_ >= text_.size()) return Fail("unexpected end");
      char next = text_[at_++];
      if (next == '}') return true;
      if (next != ',') return Fail("expected ',' or '}'");
    }
  }

  bool Array(Json* out, int depth) {
    out->type_ = Type::kArray;
    ++at_;
    SkipSpace();
    if (at_ < text_.size() && text_[at_] == ']') return ++at_, true;
    while (true) {
      out->items_.emplace_back();
      if (!Value(&out->items_.back(), depth + 1)) return false;
      SkipSpace();
      if (at_ >= text_.size()) return Fail("unexpected end");
      char next = text_[at_++];
      if (next == ']') return true;
      if (next != ',') return Fail("expected ',' or ']'");
    }
  }

  bool Hex4(uint32_t* code) {
    if (at_ + 4 > text_.size()) return Fail("short \\u escape");
    *code = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[at_++];
      int digit = isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : (c >= 'a' && c <= 'f')               ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F')               ? c - 'A' + 10
                                                         : -1;
      if (digit < 0) return Fail("bad \\u escape");
      *code = *code * 16 + static_cast<uint32_t>(digit);
    }
    return true;
  }

  static void AppendUtf8(uint32_t code, std::string* out) {
    if (code < 0x80) {
      out->push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (code >> 6)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (code >> 12)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (code >> 18)));
      out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  bool String(std::string* out) {
    ++at_;  // the opening quote
    while (at_ < text_.size()) {
      char c = text_[at_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (at_ >= text_.size()) break;
      char escaped = text_[at_++];
      switch (escaped) {
        case '"':
        case '\\':
        case '/':
          out->push_back(escaped);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t code;
          if (!Hex4(&code)) return false;
          if (code >= 0xD800 && code < 0xDC00 && text_.compare(at_, 2, "\\u") == 0) {
            at_ += 2;
            uint32_t low;
            if (!Hex4(&low)) return false;
            if (low < 0xDC00 || low >= 0xE000) return Fail("bad surrogate pair");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(code, out);
          break;
        }
        default:
          return Fail("bad escape");
      }
    }
    return Fail("unterminated string");
  }

  bool Number(Json* out) {
    size_t start = at_;
    if (at_ < text_.size() && text_[at_] == '-') ++at_;
    while (at_ < text_.size() &&
           (isdigit(static_cast<unsigned char>(text_[at_])) || text_[at_] == '.' ||
            text_[at_] == 'e' || text_[at_] == 'E' || text_[at_] == '+' || text_[at_] == '-'))
      ++at_;
    std::string digits = text_.substr(start, at_ - start);
    if (digits.empty() || digits == "-") return Fail("unexpected character");
    char* end = nullptr;
    out->number_ = strtod(digits.c_str(), &end);
    if (*end != '\0' || !std::isfinite(out->number_)) return Fail("bad number");
    out->type_ = Type::kNumber;
    return true;
  }

  const std::string& text_;
  size_t at_ = 0;
  size_t values_ = 0;
  const char* error_ = nullptr;
};

Status Json::Parse(const std::string& text, Json* out) {
  *out = Json();
  return Parser(text).Document(out);
}

const Json& Json::operator[](const std::string& key) const {
  static const Json kNull;
  auto found = members_.find(key);
  return found == members_.end() ? kNull : found->second;
}

bool Json::AsInt(int64_t low, int64_t high, int64_t* value) const {
  if (type_ != Type::kNumber || number_ != std::floor(number_) || number_ < low || number_ > high)
    return false;
  *value = static_cast<int64_t>(number_);
  return true;
}

namespace {

// The length of the valid UTF-8 sequence at text[at], or 0.
size_t Utf8Length(const std::string& text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = byte(at);
  size_t length = lead < 0x80         ? 1
                  : (lead >> 5) == 6  ? 2
                  : (lead >> 4) == 14 ? 3
                  : (lead >> 3) == 30 ? 4
                                      : 0;
  if (length == 0 || at + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i)
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
  return length;
}

}  // namespace

std::string JsonQuote(const std::string& text) {
  std::string out = "\"";
  for (size_t at = 0; at < text.size(); ++at) {
    unsigned char c = static_cast<unsigned char>(text[at]);
    if (c >= 0x80) {  // Valid UTF-8 as it is; a stray byte as U+FFFD, as Python decodes.
      size_t length = Utf8Length(text, at);
      out += length ? text.substr(at, length) : "\xef\xbf\xbd";
      at += length ? length - 1 : 0;
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[7];
      snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void JsonWriter::Key(const std::string& key) {
  if (!body_.empty()) body_ += ", ";
  body_ += JsonQuote(key) + ": ";
}

JsonWriter& JsonWriter::Add(const std::string& key, const std::string& value) {
  Key(key);
  body_ += JsonQuote(value);
  return *this;
}

JsonWriter& JsonWriter::Add(const std::string& key, int64_t value) {
  Key(key);
  body_ += std::to_string(value);
  return *this;
}

}  // namespace bps
