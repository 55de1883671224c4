// A libFuzzer target for everything that reads bytes a peer sent: the declaration
// decoder, a channel's frame reader (both transports, in the clear and sealed), a
// server's whole read path behind an authenticated worker connection (in the clear and
// sealed), and the handshake before any proof on both sides (a server's waiting room
// and a worker meeting whatever answers at a server's address), over a socket and
// over a Unix socket with a descriptor riding on the bytes. Built and run by
// run_fuzzer.sh.
#include <poll.h>
#include <sys/mman.h>
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
#include "../../../custom_ops/control/settings.h"
#include "../../../custom_ops/server/server.h"
#include "../../../custom_ops/wire/auth.h"
#include "../../../custom_ops/wire/crypto.h"
#include "../../../custom_ops/wire/protocol.h"
#include "../../../custom_ops/wire/shm/shared_memory_channel.h"
#include "../../../custom_ops/wire/stream_channel.h"
#include "../../../custom_ops/wire/tcp/tcp_transport.h"
#include "../../../custom_ops/wire/transport.h"
#include "../../../custom_ops/wire/waiting_room.h"

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

// Seals `channel` with the keys of a connection whose nonces are all zero: the side
// `server` reads what the other side seals.
void Seal(bps::StreamChannel& channel, bool server) {
  bps::ConnectionKeys keys;
  if (!bps::DeriveConnectionKeys(kToken, bps::Nonce{}, bps::Nonce{}, 0, &keys).ok()) abort();
  std::unique_ptr<bps::RecordCipher> sealer, opener;
  using Role = bps::RecordCipher::Role;
  bps::RecordCipher::Create(server ? keys.server_to_worker : keys.worker_to_server, Role::kSeal,
                            &sealer);
  bps::RecordCipher::Create(server ? keys.worker_to_server : keys.server_to_worker, Role::kOpen,
                            &opener);
  channel.Seal(std::move(sealer), std::move(opener));
}

void FeedChannel(const uint8_t* data, size_t size, bool shared_memory, bool sealed = false) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
  auto conn = std::make_unique<bps::Connection>(fds[0], "fuzzer");
  std::unique_ptr<bps::StreamChannel> channel;
  if (shared_memory) {
    channel = std::make_unique<bps::SharedMemoryChannel>(
        std::move(conn), std::make_shared<bps::SharedSlots>(std::make_shared<bps::ArenaTable>()),
        bps::SharedMemoryChannel::Side::kServer);
  } else {
    channel = std::make_unique<bps::SocketChannel>(std::move(conn));
  }
  if (sealed) Seal(*channel, true);
  if (::write(fds[1], data, size) < 0) {
  }  // At most the socket buffer: enough for an input.
  ::close(fds[1]);
  ReadFrames(*channel);
}

// The input as frames: each header (made to pass the magic check) takes its payload
// from the bytes after it, so that every parser behind the handshake gets fuzzed.
void SendAsFrames(bps::Channel& channel, const uint8_t* data, size_t size) {
  size_t at = 0;
  bps::FrameHeader header;
  while (at + sizeof(header) <= size) {
    std::memcpy(&header, data + at, sizeof(header));
    at += sizeof(header);
    header.magic = bps::kFrameMagic;
    header.length = std::min<uint64_t>(header.length, size - at);
    if (!channel.Send(header, data + at).ok()) break;
    at += header.length;
  }
}

// Well-formed sealed frames made of the input, one byte of the sealed stream flipped
// (where the input's first four bytes say), read by a sealed channel: every path that
// opens a sealed header or payload meets a valid record and a spoilt one.
void FeedTamperedSealedFrames(const uint8_t* data, size_t size) {
  if (size < 4) return;
  uint32_t flip_at = 0;
  std::memcpy(&flip_at, data, sizeof(flip_at));
  int writer_fds[2], reader_fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, writer_fds) != 0) return;
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, reader_fds) != 0) return;
  bps::SocketChannel writer(std::make_unique<bps::Connection>(writer_fds[0], "fuzzed worker"));
  bps::SocketChannel reader(std::make_unique<bps::Connection>(reader_fds[0], "fuzzed worker"));
  Seal(writer, false);
  Seal(reader, true);
  std::thread send([&] {
    SendAsFrames(writer, data + 4, size - 4);
    writer.ShutdownWrite();
  });
  std::string wire;
  char chunk[1 << 16];
  for (ssize_t n; (n = ::read(writer_fds[1], chunk, sizeof(chunk))) > 0;) wire.append(chunk, n);
  send.join();
  ::close(writer_fds[1]);
  if (!wire.empty()) wire[flip_at % wire.size()] ^= static_cast<char>(1 + (flip_at >> 24) % 255);
  std::thread deliver([&] {
    if (::write(reader_fds[1], wire.data(), wire.size()) < 0) {
    }
    ::close(reader_fds[1]);
  });
  ReadFrames(reader);
  reader.Shutdown();
  deliver.join();
}

// A fresh server for each input: a worker proves the token, then sends the bytes.
void FeedServer(const uint8_t* data, size_t size, bool sealed) {
  // A real server's defaults (the settings table's): a zero max_tensor_bytes would refuse
  // every declaration, and the rounds behind them would go unfuzzed.
  bps::ServerOptions options = bps::ServerOptions::From(bps::Settings::Defaults());
  options.engine_threads = 1;
  options.timeout_ms = 2000;
  options.token = kToken;
  options.encrypt = sealed;
  bps::Server server(options);
  int port = 0;
  if (!server.Listen(&port).ok() || !server.Serve({0, 1}).ok()) return;
  std::unique_ptr<bps::Channel> worker;
  if (!bps::ConnectToServer(bps::ServerAddress{"127.0.0.1", port}, "server",
                            bps::JobSecret(kToken, sealed), 0, 2000, &worker)
           .ok())
    return;
  SendAsFrames(*worker, data, size);
  worker->ShutdownWrite();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  server.Stop();
}

// A connected pair whose far end has sent `data` (a memfd riding on the first byte when
// `with_fd`) and closed: the near end is what a handshake reads.
std::unique_ptr<bps::Connection> Peer(const uint8_t* data, size_t size, bool with_fd) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return nullptr;
  size_t sent = 0;
  if (with_fd && size > 0) {
    const int memory = ::memfd_create("fuzz", MFD_CLOEXEC);
    iovec part{const_cast<uint8_t*>(data), 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&message);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &memory, sizeof(int));
    if (memory >= 0 && ::sendmsg(fds[1], &message, 0) == 1) sent = 1;
    if (memory >= 0) ::close(memory);
  }
  if (::write(fds[1], data + sent, size - sent) < 0) {
  }  // At most the socket buffer: enough for an input.
  ::close(fds[1]);
  return std::make_unique<bps::Connection>(fds[0], "fuzzed peer");
}

// A server's waiting room meets the input as a connection that has not proven the
// token: it must drop it (or, were the proof right, welcome it) without waiting.
void FeedWaitingRoom(const uint8_t* data, size_t size, bool local, bool sealed) {
  bps::WaitingRoom::Options options;
  options.secret = bps::JobSecret(kToken, sealed);
  options.num_workers = 2;
  options.deadline_ms = 20;
  bps::WaitingRoom room(std::move(options));
  std::unique_ptr<bps::Connection> connection = Peer(data, size, local);
  if (!connection) return;
  room.Enter(std::move(connection), local ? "local" : "10.0.0.1", local);
  std::vector<pollfd> fds;
  std::vector<bps::WaitingRoom::Proven> proven;
  for (int turn = 0; turn < 64 && room.size() > 0; ++turn) {
    fds.clear();
    room.Watch(&fds);
    ::poll(fds.data(), fds.size(), room.MsUntilNextDeadline());
    room.Serve(fds, &proven);
  }
}

// A worker's handshake meets the input as whatever answers at a server's address.
void FeedWorkerHandshake(const uint8_t* data, size_t size, bool with_fd, bool sealed) {
  std::unique_ptr<bps::Connection> connection = Peer(data, size, with_fd);
  if (connection) bps::AuthenticateServer(*connection, bps::JobSecret(kToken, sealed), 1, 20);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = [] {
    bps::SetLogLevel(bps::LogLevel::kError);
    return true;
  }();
  (void)quiet;
  if (size == 0) return 0;
  const uint8_t target = data[0] % 9;
  // For the handshakes: a descriptor rides along (or the Unix socket is the way in),
  // and whether the job seals.
  const bool twist = data[0] & 0x80, sealing = data[0] & 0x40;
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
      FeedServer(data, size, false);
      break;
    case 4:
      FeedChannel(data, size, false, true);
      break;
    case 5:
      FeedTamperedSealedFrames(data, size);
      break;
    case 6:
      FeedServer(data, size, true);
      break;
    case 7:
      FeedWaitingRoom(data, size, twist, sealing);
      break;
    case 8:
      FeedWorkerHandshake(data, size, twist, sealing);
      break;
  }
  return 0;
}
