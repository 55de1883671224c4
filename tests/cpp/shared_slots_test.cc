// Unit tests of shared-memory slots (wire/shared_memory.h): where slots go,
// when their memory is given back, and how a channel holds what its peer may read.
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "../../custom_ops/wire/shm/shared_memory_channel.h"
#include "../../custom_ops/wire/transport.h"
#include "expect.h"

namespace bps {
namespace {

constexpr size_t kMiB = 1 << 20;

// Bytes of memory behind arena `index` (its pages that were written and not freed).
size_t Resident(const SharedSlots& slots, uint32_t index) {
  struct stat info;
  if (::fstat(slots.table().Get(index)->fd(), &info) != 0) return 0;
  return static_cast<size_t>(info.st_blocks) * 512;
}

char* Write(SharedSlots& slots, const SlotKey& key, size_t bytes, ShmLocation* location) {
  char* data = nullptr;
  EXPECT(slots.Slot(key, bytes, &data, location).ok());
  if (data) std::memset(data, 7, bytes);
  return data;
}

void TestSlotsReuseMoveAndFree() {
  SharedSlots slots(std::make_shared<ArenaTable>());
  const SlotKey key{{1, 0}, 0};
  ShmLocation first, again, grown;
  Write(slots, key, 1000, &first);
  slots.Release(first);
  // Data that still fits stays where it is.
  Write(slots, key, 900, &again);
  slots.Release(again);
  EXPECT(again.arena == first.arena && again.offset == first.offset);
  // Data that outgrows its slot moves; nobody holds the old one, so it is free at once.
  Write(slots, key, 3 * kMiB, &grown);
  slots.Release(grown);
  EXPECT(slots.used_bytes() == 3 * kMiB);
  EXPECT(Resident(slots, 0) >= 3 * kMiB);
  // Retired and held by nobody: freed, its pages given back.
  slots.Retire(1);
  EXPECT(slots.used_bytes() == 0);
  EXPECT(Resident(slots, 0) < kMiB);
  // Freed memory is cut again before any new arena is made.
  ShmLocation other;
  Write(slots, SlotKey{{2, 0}, 0}, 2 * kMiB, &other);
  slots.Release(other);
  EXPECT(other.arena == 0 && slots.table().size() == 1);
  // Data that shrank to a small part of its slot moves, so the large slot goes.
  Write(slots, SlotKey{{2, 0}, 0}, 1000, &other);
  slots.Release(other);
  EXPECT(slots.used_bytes() == 1024);
}

void TestHeldSlotsOutliveTheirKey() {
  SharedSlots slots(std::make_shared<ArenaTable>());
  const SlotKey key{{3, 1}, 0};
  ShmLocation written, seen, grown;
  char* data = Write(slots, key, kMiB, &written);
  // A peer was handed the data: it stays when the key moves on, until the peer lets go.
  EXPECT(slots.Hold(data + 100, 1000, &seen));
  EXPECT(seen.arena == written.arena && seen.offset == written.offset + 100);
  slots.Release(written);
  Write(slots, key, 2 * kMiB, &grown);
  slots.Release(grown);
  EXPECT(slots.used_bytes() == 3 * kMiB);
  slots.Release(seen);
  EXPECT(slots.used_bytes() == 2 * kMiB);
  // A retired slot waits for its holders as well.
  EXPECT(slots.Hold(data + 100, 1000, &seen) == false);  // freed: no slot there any more
  ShmLocation held;
  char* now = Write(slots, key, 2 * kMiB, &held);
  slots.Retire(3);
  EXPECT(slots.used_bytes() == 2 * kMiB);
  EXPECT(now[0] == 7);
  slots.Release(held);
  EXPECT(slots.used_bytes() == 0);
  // Memory that is no slot of ours is never held.
  std::vector<char> elsewhere(64);
  EXPECT(!slots.Hold(elsewhere.data(), elsewhere.size(), &seen));
}

void TestIdleSlotsAreFreed() {
  SharedSlots slots(std::make_shared<ArenaTable>(), std::chrono::milliseconds(50));
  ShmLocation once, busy, held, next;
  Write(slots, SlotKey{{10, 0}, 0}, kMiB, &once);
  slots.Release(once);
  Write(slots, SlotKey{{11, 0}, 0}, kMiB, &held);  // still held: never idle
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  Write(slots, SlotKey{{12, 0}, 0}, kMiB, &next);  // allocating looks for idle slots
  slots.Release(next);
  EXPECT(slots.used_bytes() == 2 * kMiB);  // the held one and the new one
  slots.Release(held);
  // Used again after it went: a fresh slot, whole.
  char* data = Write(slots, SlotKey{{10, 0}, 0}, kMiB, &busy);
  EXPECT(data && data[kMiB - 1] == 7);
  slots.Release(busy);
}

void MakePair(std::shared_ptr<SharedSlots> worker_slots, std::shared_ptr<SharedSlots> server_slots,
              std::unique_ptr<Channel>* worker, std::unique_ptr<Channel>* server) {
  int fds[2];
  EXPECT(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  *worker = std::make_unique<SharedMemoryChannel>(std::make_unique<Connection>(fds[0], "server"),
                                                  worker_slots, SharedMemoryChannel::Side::kWorker);
  *server = std::make_unique<SharedMemoryChannel>(std::make_unique<Connection>(fds[1], "worker"),
                                                  server_slots, SharedMemoryChannel::Side::kServer);
}

FrameHeader Frame(FrameType type, size_t bytes, uint32_t round) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(type);
  header.tensor_id = 5;
  header.part = 2;
  header.round = round;
  header.length = bytes;
  return header;
}

void TestChannelsHoldWhatPeersMayRead() {
  auto worker_slots = std::make_shared<SharedSlots>(std::make_shared<ArenaTable>());
  auto server_slots = std::make_shared<SharedSlots>(std::make_shared<ArenaTable>());
  std::unique_ptr<Channel> worker, server;
  MakePair(worker_slots, server_slots, &worker, &server);
  const SlotKey key{{5, 2}, 0};
  const std::vector<char> data(kMiB, 3);
  FrameHeader header;
  DataReader payload;
  bool eof = false;

  // A push is staged in a slot held until its round is answered: retiring the tensor
  // meanwhile keeps the memory the server may still be summing from.
  EXPECT(worker->SendData(Frame(FrameType::kPush, kMiB, 1), data.data(), key).ok());
  EXPECT(server->Receive(&header, &payload, &eof).ok() && payload.View(kMiB));
  worker->RetireSlots(5);
  EXPECT(worker_slots->used_bytes() == kMiB);
  // An answer for another round is not this push's.
  EXPECT(server->Send(Frame(FrameType::kError, 0, 7), nullptr).ok());
  EXPECT(worker->Receive(&header, &payload, &eof).ok());
  EXPECT(worker_slots->used_bytes() == kMiB);
  EXPECT(server->Send(Frame(FrameType::kError, 0, 1), nullptr).ok());
  EXPECT(worker->Receive(&header, &payload, &eof).ok());
  EXPECT(worker_slots->used_bytes() == 0);

  // A result sent as a location is held until the worker acknowledges the fence sent
  // right behind it, which it does before its next frame, once it has read the result.
  char* result = nullptr;
  ShmLocation location;
  EXPECT(server_slots->Slot(key, kMiB, &result, &location).ok());
  std::memset(result, 9, kMiB);
  EXPECT(server->SendData(Frame(FrameType::kReply, kMiB, 1), result, key).ok());
  server_slots->Release(location);  // the server's own hold, as at the end of a round
  server_slots->Retire(5);
  std::vector<char> got(kMiB);
  EXPECT(worker->Receive(&header, &payload, &eof).ok());
  EXPECT(header.type == static_cast<uint8_t>(FrameType::kReply) && header.length == kMiB);
  EXPECT(payload.Read(got.data(), kMiB).ok() && got[kMiB - 1] == 9);
  EXPECT(server_slots->used_bytes() == kMiB);
  // The worker's receiving thread takes the fence on its way to the next frame (none
  // comes: it times out), and the acknowledgement goes out ahead of its next frame.
  worker->SetReceiveTimeout(100);
  EXPECT(!worker->Receive(&header, &payload, &eof).ok());
  EXPECT(server_slots->used_bytes() == kMiB);
  EXPECT(worker->SendData(Frame(FrameType::kPush, 0, 2), nullptr, key).ok());
  EXPECT(server->Receive(&header, &payload, &eof).ok());
  EXPECT(header.type == static_cast<uint8_t>(FrameType::kPush));
  EXPECT(server_slots->used_bytes() == 0);

  // A peer that acknowledges a fence never sent is not believed.
  FrameHeader lie = Frame(FrameType::kFenceAck, 0, 0);
  lie.tensor_id = 1000;
  EXPECT(server_slots->Slot(key, kMiB, &result, &location).ok());
  EXPECT(server->SendData(Frame(FrameType::kReply, kMiB, 3), result, key).ok());
  server_slots->Release(location);
  server_slots->Retire(5);
  EXPECT(worker->Send(lie, nullptr).ok());
  EXPECT(worker->Send(Frame(FrameType::kAbandon, 0, 3), nullptr).ok());
  EXPECT(server->Receive(&header, &payload, &eof).ok());
  EXPECT(server_slots->used_bytes() == kMiB);
}

}  // namespace

void TestSharedSlots() {
  TestSlotsReuseMoveAndFree();
  TestHeldSlotsOutliveTheirKey();
  TestIdleSlotsAreFreed();
  TestChannelsHoldWhatPeersMayRead();
}

}  // namespace bps
