// Unit tests of sealed frames (BYTEPS_ENCRYPT, custom_ops/wire/crypto.h): what one
// side seals the other opens, in order, and a frame tampered with, replayed or
// reordered on the way is refused naming its sender. The bytes between the two
// channels pass through this test, which plays the attacker in the middle.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../custom_ops/wire/auth.h"
#include "../../custom_ops/wire/crypto.h"
#include "../../custom_ops/wire/tcp/tcp_transport.h"
#include "../../custom_ops/wire/transport.h"
#include "expect.h"

namespace bps {
namespace {

constexpr char kToken[] = "the sealed frames' token";
constexpr size_t kTag = RecordCipher::kTagBytes;

std::unique_ptr<RecordCipher> Cipher(const SealKey& key, RecordCipher::Role role) {
  std::unique_ptr<RecordCipher> cipher;
  EXPECT(RecordCipher::Create(key, role, &cipher).ok());
  return cipher;
}

std::pair<int, int> SocketPair() {
  int fds[2];
  EXPECT(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  return {fds[0], fds[1]};
}

// A worker's channel whose sealed bytes the test reads (`tap`), and a server's channel
// that reads what the test writes into `feed`: both sealed with the keys of one
// connection, as the handshake would have left them.
struct Wiretap {
  Wiretap() {
    ConnectionKeys keys;
    Nonce server_nonce{}, worker_nonce{};
    server_nonce[0] = 1;
    worker_nonce[0] = 2;
    EXPECT(DeriveConnectionKeys(kToken, server_nonce, worker_nonce, 3, &keys).ok());
    auto [worker_end, tap_end] = SocketPair();
    auto [server_end, feed_end] = SocketPair();
    tap = tap_end;
    feed = feed_end;
    worker = std::make_unique<SocketChannel>(std::make_unique<Connection>(worker_end, "server"));
    server = std::make_unique<SocketChannel>(std::make_unique<Connection>(server_end, "worker 3"));
    worker->Seal(Cipher(keys.worker_to_server, RecordCipher::Role::kSeal),
                 Cipher(keys.server_to_worker, RecordCipher::Role::kOpen));
    server->Seal(Cipher(keys.server_to_worker, RecordCipher::Role::kSeal),
                 Cipher(keys.worker_to_server, RecordCipher::Role::kOpen));
  }
  ~Wiretap() {
    for (std::thread& delivery : deliveries) delivery.join();
    ::close(tap);
    ::close(feed);
  }

  // The worker sends a push of `payload`; returns the sealed frame as it crossed the wire.
  std::string SendFromWorker(uint32_t round, const std::string& payload) {
    FrameHeader header;
    header.type = static_cast<uint8_t>(FrameType::kPush);
    header.round = round;
    header.length = payload.size();
    std::thread send(  // A large frame fills the socket before it is read.
        [&] { EXPECT(worker->Send(header, payload.empty() ? nullptr : payload.data()).ok()); });
    std::string sealed(sizeof(FrameHeader) + kTag + (payload.empty() ? 0 : payload.size() + kTag),
                       '\0');
    EXPECT(::recv(tap, sealed.data(), sealed.size(), MSG_WAITALL) ==
           static_cast<ssize_t>(sealed.size()));
    send.join();
    return sealed;
  }

  // Written while the server reads (joined when the wiretap goes).
  void Deliver(std::string bytes) {
    deliveries.emplace_back([this, bytes = std::move(bytes)] {
      EXPECT(::send(feed, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
             static_cast<ssize_t>(bytes.size()));
    });
  }

  // What the server makes of the next frame: its payload, or why it refused it.
  Status ReceiveAtServer(FrameHeader* header, std::string* payload) {
    DataReader reader;
    bool eof = false;
    Status status = server->Receive(header, &reader, &eof);
    if (!status.ok()) return status;
    payload->assign(reader.remaining(), '\0');
    return reader.Read(payload->data(), payload->size());
  }

  int tap = -1, feed = -1;
  std::unique_ptr<SocketChannel> worker, server;
  std::vector<std::thread> deliveries;
};

bool Refused(const Status& status) {
  return !status.ok() && status.message().find("worker 3") != std::string::npos &&
         status.message().find("does not authenticate") != std::string::npos;
}

void TestSealedFramesArriveInOrder() {
  Wiretap wire;
  const std::string small = "four", none;
  std::string large(1 << 20, '\0');  // several pieces of the sender's
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 7);
  for (const std::string* payload : std::vector<const std::string*>{&small, &none, &large}) {
    const std::string sealed = wire.SendFromWorker(5, *payload);
    // The data is not in the clear on the wire.
    if (payload->size() >= 4) EXPECT(sealed.find(payload->substr(0, 64)) == std::string::npos);
    wire.Deliver(sealed);
    FrameHeader header;
    std::string got;
    EXPECT(wire.ReceiveAtServer(&header, &got).ok());
    EXPECT(header.round == 5 && got == *payload);
  }
  // And the other way.
  std::thread reply([&] {
    FrameHeader header;
    header.type = static_cast<uint8_t>(FrameType::kReply);
    header.length = small.size();
    EXPECT(wire.server->Send(header, small.data()).ok());
  });
  std::string sealed(sizeof(FrameHeader) + kTag + small.size() + kTag, '\0');
  EXPECT(::recv(wire.feed, sealed.data(), sealed.size(), MSG_WAITALL) ==
         static_cast<ssize_t>(sealed.size()));
  reply.join();
  EXPECT(::send(wire.tap, sealed.data(), sealed.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(sealed.size()));
  FrameHeader header;
  DataReader reader;
  bool eof = false;
  EXPECT(wire.worker->Receive(&header, &reader, &eof).ok());
  // Not read in place: the buffer it was opened in serves the next frame.
  EXPECT(reader.View(small.size()) == nullptr);
  std::string got(small.size(), '\0');
  EXPECT(reader.Read(got.data(), got.size()).ok() && got == small);
}

void TestTamperedFramesAreRefused() {
  FrameHeader header;
  std::string got;
  {  // A bit of the payload flipped.
    Wiretap wire;
    std::string sealed = wire.SendFromWorker(1, "gradient");
    sealed[sizeof(FrameHeader) + kTag + 2] ^= 1;
    wire.Deliver(sealed);
    EXPECT(Refused(wire.ReceiveAtServer(&header, &got)));
  }
  {  // The header's length (in the clear, but authenticated) changed.
    Wiretap wire;
    std::string sealed = wire.SendFromWorker(1, "gradient");
    sealed[offsetof(FrameHeader, length)] ^= 4;
    wire.Deliver(sealed);
    EXPECT(Refused(wire.ReceiveAtServer(&header, &got)));
  }
  {  // A frame's tag cut off and the next frame's bytes taken for it.
    Wiretap wire;
    std::string first = wire.SendFromWorker(1, "gradient");
    first.resize(first.size() - kTag);
    wire.Deliver(first + wire.SendFromWorker(2, "more"));
    EXPECT(Refused(wire.ReceiveAtServer(&header, &got)));
  }
}

void TestReplayedAndReorderedFramesAreRefused() {
  FrameHeader header;
  std::string got;
  {  // Replayed: the first frame again after it was taken.
    Wiretap wire;
    const std::string first = wire.SendFromWorker(1, "round one");
    wire.Deliver(first);
    EXPECT(wire.ReceiveAtServer(&header, &got).ok() && got == "round one");
    wire.Deliver(first);
    EXPECT(Refused(wire.ReceiveAtServer(&header, &got)));
  }
  {  // Reordered: the second frame delivered first.
    Wiretap wire;
    const std::string first = wire.SendFromWorker(1, "round one");
    const std::string second = wire.SendFromWorker(2, "round two");
    wire.Deliver(second + first);
    EXPECT(Refused(wire.ReceiveAtServer(&header, &got)));
  }
  {  // Dropped: the second frame arrives without the first.
    Wiretap wire;
    (void)wire.SendFromWorker(1, "round one");
    wire.Deliver(wire.SendFromWorker(2, "round two"));
    EXPECT(Refused(wire.ReceiveAtServer(&header, &got)));
  }
}

// The handshake seals both sides when both say so, and a worker that seals is told
// plainly by a server that does not (and the other way round).
void TestHandshakeAgreesOnSealing() {
  for (bool worker_seals : {true, false}) {
    for (bool server_seals : {true, false}) {
      auto [server_end, worker_end] = SocketPair();
      auto server_connection = std::make_unique<Connection>(server_end, "worker 1");
      auto worker_connection = std::make_unique<Connection>(worker_end, "server");
      Status worker_side = Status::OK();
      std::thread client([&] {
        worker_side =
            AuthenticateServer(*worker_connection, JobSecret(kToken, worker_seals), 1, 2000);
      });
      uint32_t rank = 99;
      Status server_side =
          AuthenticateWorker(*server_connection, JobSecret(kToken, server_seals), 2, 2000, &rank);
      client.join();
      SocketChannel server(std::move(server_connection));
      SocketChannel worker(std::move(worker_connection));
      if (worker_seals != server_seals) {
        EXPECT(!server_side.ok() && !worker_side.ok());
        EXPECT(worker_side.kind() == ErrorKind::kInvalidArgument);
        EXPECT(worker_side.message().find("BYTEPS_ENCRYPT") != std::string::npos);
        EXPECT(worker_side.message().find(
                   worker_seals ? "worker 1 seals its frames"
                                : "worker 1 sends its frames in the clear") != std::string::npos);
        continue;
      }
      EXPECT(server_side.ok() && worker_side.ok() && rank == 1);
      std::thread push([&] {
        FrameHeader header;
        header.type = static_cast<uint8_t>(FrameType::kPush);
        header.length = 5;
        EXPECT(worker.Send(header, "hello").ok());
      });
      // Sealed or not, the server reads the worker's frame.
      FrameHeader header;
      DataReader reader;
      bool eof = false;
      EXPECT(server.Receive(&header, &reader, &eof).ok());
      std::string got(reader.remaining(), '\0');
      EXPECT(reader.Read(got.data(), got.size()).ok() && got == "hello");
      push.join();
    }
  }
}

}  // namespace

void TestSealedFrames() {
  TestSealedFramesArriveInOrder();
  TestTamperedFramesAreRefused();
  TestReplayedAndReorderedFramesAreRefused();
  TestHandshakeAgreesOnSealing();
}

}  // namespace bps
