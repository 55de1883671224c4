// The shared-memory transport: tensor data lies in memfd arenas that both sides
// map; the Unix socket carries frames, arena descriptors and data locations.
#include <unistd.h>

#include <cstring>

#include "transport.h"

namespace bps {

SharedMemoryChannel::SharedMemoryChannel(std::unique_ptr<Connection> conn,
                                         std::shared_ptr<SharedSlots> slots, Side side)
    : Channel(std::move(conn)), slots_(std::move(slots)), side_(side) {}

Status SharedMemoryChannel::SendData(FrameHeader header, const void* data, const SlotKey& slot) {
  ShmLocation location;
  bool shared = header.length > 0 && slots_->table().Locate(data, header.length, &location);
  if (!shared && header.length > 0 && side_ == Side::kWorker) {
    char* staged = nullptr;
    Status status = slots_->Slot(slot, header.length, &staged, &location);
    if (!status.ok()) return status;
    std::memcpy(staged, data, header.length);
    shared = true;
  }
  if (!shared) return Send(header, data);  // An empty acknowledgement, say.
  std::lock_guard<std::mutex> lock(write_mutex_);
  // The peer must hold every arena up to the slot's before it reads the location.
  while (announced_ <= location.arena) {
    std::shared_ptr<SharedArena> arena = slots_->table().Get(announced_);
    const ArenaAnnouncement announcement{announced_, 0, arena->size()};
    FrameHeader frame;
    frame.type = static_cast<uint8_t>(FrameType::kArena);
    frame.length = sizeof(announcement);
    Status status = conn_->Send(frame, &announcement, arena->fd());
    if (!status.ok()) return status;
    ++announced_;
  }
  header.type = static_cast<uint8_t>(header.type == static_cast<uint8_t>(FrameType::kPush)
                                         ? FrameType::kPushShm
                                         : FrameType::kReplyShm);
  header.length = sizeof(location);
  return conn_->Send(header, &location);
}

Status SharedMemoryChannel::AddPeerArena(const FrameHeader& header, DataReader* payload) {
  const int fd = conn_->TakeReceivedFd();
  ArenaAnnouncement announcement;
  Status status = header.length == sizeof(announcement)
                      ? payload->Read(&announcement, sizeof(announcement))
                      : Status::Error("a malformed shared-memory announcement from " + peer());
  if (status.ok() && fd < 0)
    status = Status::Error(peer() + " announced shared memory without its descriptor");
  if (!status.ok()) {
    if (fd >= 0) ::close(fd);
    return status;
  }
  std::shared_ptr<SharedArena> arena;
  status = SharedArena::Map(fd, announcement.size, &arena);  // Owns fd.
  if (!status.ok()) return Status::Error(status.message() + " (announced by " + peer() + ")");
  if (side_ == Side::kServer) slots_->table().Add(arena);
  peer_arenas_.Add(announcement.index, std::move(arena));
  return Status::OK();
}

Status SharedMemoryChannel::Receive(FrameHeader* header, DataReader* payload, bool* eof) {
  while (true) {
    Status status = ReceiveFromSocket(header, payload, eof);
    if (!status.ok()) return status;
    const auto type = static_cast<FrameType>(header->type);
    if (type == FrameType::kArena) {
      status = AddPeerArena(*header, payload);
      if (!status.ok()) return status;
      continue;
    }
    if (type != FrameType::kPushShm && type != FrameType::kReplyShm) return Status::OK();
    ShmLocation location;
    if (header->length != sizeof(location))
      return Status::Error("a malformed shared-memory frame from " + peer());
    status = payload->Read(&location, sizeof(location));
    if (!status.ok()) return status;
    const char* data = peer_arenas_.Resolve(location);
    if (!data) return Status::Error(peer() + " pointed outside the shared memory it announced");
    header->type =
        static_cast<uint8_t>(type == FrameType::kPushShm ? FrameType::kPush : FrameType::kReply);
    header->length = location.length;
    *payload = DataReader::OfMemory(data, location.length);
    return Status::OK();
  }
}

}  // namespace bps
