// A libFuzzer target for everything that reads bytes a peer sent: the declaration
// decoder, a channel's frame reader (both transports), and a server's whole read
// path behind an authenticated worker connection. Built and run by run_fuzzer.sh.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "../../../custom_ops/common/logging.h"
#include "../../../custom_ops/server/server.h"
#include "../../../custom_ops/wire/protocol.h"
#include "../../../custom_ops/wire/transport.h"

namespace {

constexpr char kToken[] = "fuzz-token";

// Reads frames from `bytes` as a peer's stream until the channel gives up.
void ReadFrames(bps::Channel& channel) {
  bps::FrameHeader header;
  bps::DataReader payload;
  bool eof = false;
  for (int frames = 0; frames < 64 && channel.Receive(&header, &payload, &eof).ok(); ++frames) {
    char sink[256];
    const size_t some = payload.remaining() < sizeof(sink) ? payload.remaining() : sizeof(sink);
    if (!payload.View(some) && !payload.Read(sink, some).ok()) return;
    if (!payload.Skip().ok()) return;
  }
}

void FeedChannel(const uint8_t* data, size_t size, bool shared_memory) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
  auto conn = std::make_unique<bps::Connection>(fds[0], "fuzzer");
  std::unique_ptr<bps::Channel> channel;
  if (shared_memory) {
    channel = std::make_unique<bps::SharedMemoryChannel>(
        std::move(conn), std::make_shared<bps::SharedSlots>(std::make_shared<bps::ArenaTable>()),
        bps::SharedMemoryChannel::Side::kServer);
  } else {
    channel = std::make_unique<bps::SocketChannel>(std::move(conn));
  }
  if (::write(fds[1], data, size) < 0) {
  }  // At most the socket buffer: enough for an input.
  ::close(fds[1]);
  ReadFrames(*channel);
}

// A fresh server for each input: a worker proves the token, then sends the bytes.
void FeedServer(const uint8_t* data, size_t size) {
  bps::ServerOptions options;
  options.engine_threads = 1;
  options.timeout_ms = 2000;
  options.token = kToken;
  bps::Server server(options);
  int port = 0;
  if (!server.Listen(&port).ok() || !server.Serve({0, 1}).ok()) return;
  std::unique_ptr<bps::Channel> worker;
  if (!bps::ConnectToServer(bps::ServerAddress{"127.0.0.1", port}, "server", kToken, 0, 2000,
                            &worker)
           .ok())
    return;
  // The input as frames: each header (made to pass the magic check) takes its payload
  // from the bytes after it, so that every parser behind the handshake gets fuzzed.
  size_t at = 0;
  bps::FrameHeader header;
  while (at + sizeof(header) <= size) {
    std::memcpy(&header, data + at, sizeof(header));
    at += sizeof(header);
    header.magic = bps::kFrameMagic;
    header.length = std::min<uint64_t>(header.length, size - at);
    if (!worker->Send(header, data + at).ok()) break;
    at += header.length;
  }
  worker->ShutdownWrite();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  server.Stop();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = [] {
    bps::SetLogLevel(bps::LogLevel::kError);
    return true;
  }();
  (void)quiet;
  if (size == 0) return 0;
  const uint8_t target = data[0] % 4;
  ++data;
  --size;
  switch (target) {
    case 0: {
      bps::Declaration declaration;
      bps::DecodeDeclaration(std::string(reinterpret_cast<const char*>(data), size), &declaration);
      break;
    }
    case 1:
      FeedChannel(data, size, false);
      break;
    case 2:
      FeedChannel(data, size, true);
      break;
    case 3:
      FeedServer(data, size);
      break;
  }
  return 0;
}
