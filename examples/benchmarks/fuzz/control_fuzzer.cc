// A libFuzzer target for what the control plane reads off the network: the JSON
// parser (every scheduler message the native server takes) and the ZeroMQ DEALER's
// reader (the scheduler's greeting, commands and frames), fed as a scheduler would
// send them. Built and run by run_fuzzer.sh.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "../../../custom_ops/common/logging.h"
#include "../../../custom_ops/control/json.h"
#include "../../../custom_ops/control/zmq_dealer.h"

namespace {

// Walks a parsed document the way the server's scheduler link reads its messages.
void Walk(const bps::Json& json, int depth = 0) {
  int64_t value = 0;
  json.AsInt(0, INT32_MAX, &value);
  for (const char* key : {"type", "reason", "server_id", "generation", "merge_groups", "workers"})
    json[key].AsInt(0, UINT32_MAX, &value);
  if (depth > 40) return;
  for (const bps::Json& item : json.items()) Walk(item, depth + 1);
}

void ParseJson(const uint8_t* data, size_t size) {
  bps::Json json;
  if (bps::Json::Parse(std::string(reinterpret_cast<const char*>(data), size), &json).ok())
    Walk(json);
}

// The bytes arrive as the scheduler's side of a DEALER's connection: greeting, READY
// and messages, or anything else.
void FeedDealer(const uint8_t* data, size_t size) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
  if (::write(fds[1], data, size) < 0) {
  }  // At most the socket buffer: enough for an input.
  ::shutdown(fds[1], SHUT_WR);
  std::unique_ptr<bps::ZmqDealer> dealer;  // It owns fds[0] either way.
  if (bps::ZmqDealer::Adopt(fds[0], "fuzzer", 50, &dealer).ok()) {
    for (int messages = 0; messages < 64; ++messages) {
      std::string message;
      bool received = false;
      if (!dealer->Receive(0, &message, &received).ok() || !received) break;
      ParseJson(reinterpret_cast<const uint8_t*>(message.data()), message.size());
    }
  }
  ::close(fds[1]);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  bps::SetLogLevel(bps::LogLevel::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    ParseJson(data + 1, size - 1);
  } else {
    FeedDealer(data + 1, size - 1);
  }
  return 0;
}
