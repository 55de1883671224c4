// The shared-memory channel: tensor data lies in memfd arenas that both sides
// map; the Unix socket carries frames, arena descriptors and data locations.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "shared_memory_channel.h"

namespace bps {

SharedMemoryChannel::SharedMemoryChannel(std::unique_ptr<Connection> conn,
                                         std::shared_ptr<SharedSlots> slots, Side side)
    : StreamChannel(std::move(conn)), slots_(std::move(slots)), side_(side) {}

SharedMemoryChannel::~SharedMemoryChannel() {
  // The peer is gone or going: what it held is no longer read through this channel.
  for (const auto& [partition, pushes] : held_pushes_)
    for (const auto& [round, location] : pushes) slots_->Release(location);
  for (const auto& [fence, location] : held_replies_) slots_->Release(location);
}

bool SharedMemoryChannel::Locate(const FrameHeader& header, const void* data, const SlotKey& slot,
                                 ShmLocation* location, Status* status) {
  if (header.length == 0) return false;  // An empty acknowledgement, say.
  if (slots_->Hold(data, header.length, location)) return true;
  if (side_ != Side::kWorker) return false;
  char* staged = nullptr;
  *status = slots_->Slot(slot, header.length, &staged, location);  // Held for the peer.
  if (!status->ok()) return false;
  std::memcpy(staged, data, header.length);
  return true;
}

void SharedMemoryChannel::HoldForPeer(const FrameHeader& header, const ShmLocation& location) {
  std::lock_guard<std::mutex> lock(held_mutex_);
  if (header.type == static_cast<uint8_t>(FrameType::kPush)) {
    held_pushes_[PartitionKey{header.tensor_id, header.part}].emplace_back(header.round, location);
  } else {
    held_replies_.emplace_back(fences_sent_ + 1, location);
    fence_due_ = true;
  }
}

Status SharedMemoryChannel::SendData(FrameHeader header, const void* data, const SlotKey& slot) {
  ShmLocation location;
  Status status = Status::OK();
  if (!Locate(header, data, slot, &location, &status)) {
    return status.ok() ? Send(header, data) : status;
  }
  // Held before it is sent: the answer may come back before Send returns.
  HoldForPeer(header, location);
  std::lock_guard<std::mutex> lock(write_mutex_);
  // The peer must hold every arena up to the slot's before it reads the location.
  while (announced_ <= location.arena) {
    std::shared_ptr<SharedArena> arena = slots_->table().Get(announced_);
    const ArenaAnnouncement announcement{announced_, 0, arena->size()};
    FrameHeader frame;
    frame.type = static_cast<uint8_t>(FrameType::kArena);
    frame.length = sizeof(announcement);
    status = conn_->Send(frame, &announcement, arena->fd());
    if (!status.ok()) return status;
    ++announced_;
  }
  header.type = static_cast<uint8_t>(header.type == static_cast<uint8_t>(FrameType::kPush)
                                         ? FrameType::kPushShm
                                         : FrameType::kReplyShm);
  header.length = sizeof(location);
  status = conn_->Send(header, &location);
  if (status.ok()) SendControlLocked();  // A reply's fence goes right behind it.
  return status;
}

void SharedMemoryChannel::SendControlLocked() {
  FrameHeader frame;
  {
    std::lock_guard<std::mutex> lock(held_mutex_);
    if (acknowledgement_) {
      frame.type = static_cast<uint8_t>(FrameType::kFenceAck);
      frame.tensor_id = acknowledgement_;
      acknowledgement_ = 0;
    } else if (fence_due_ && fences_sent_ == fences_acknowledged_) {
      frame.type = static_cast<uint8_t>(FrameType::kFence);
      frame.tensor_id = ++fences_sent_;
      fence_due_ = false;
    } else {
      return;
    }
  }
  // A failure shows in the caller's own send, next.
  if (conn_->Send(frame, nullptr).ok() && frame.type == static_cast<uint8_t>(FrameType::kFenceAck))
    SendControlLocked();  // and a fence, if one is due too
}

void SharedMemoryChannel::OnPeerFrame(const FrameHeader& header) {
  const auto type = static_cast<FrameType>(header.type);
  std::vector<ShmLocation> released;
  {
    std::lock_guard<std::mutex> lock(held_mutex_);
    if (type == FrameType::kFence) {
      acknowledgement_ = header.tensor_id;
      return;
    }
    if (type == FrameType::kFenceAck) {
      // Fences are numbered one by one; a later number than was sent is the peer's lie.
      if (header.tensor_id > fences_sent_) return;
      fences_acknowledged_ = std::max(fences_acknowledged_, header.tensor_id);
      while (!held_replies_.empty() && held_replies_.front().first <= fences_acknowledged_) {
        released.push_back(held_replies_.front().second);
        held_replies_.pop_front();
      }
    } else if (type == FrameType::kReply || type == FrameType::kReplyShm ||
               type == FrameType::kError) {
      auto found = held_pushes_.find(PartitionKey{header.tensor_id, header.part});
      if (found == held_pushes_.end()) return;
      auto& pushes = found->second;
      for (auto it = pushes.begin(); it != pushes.end(); ++it) {
        if (it->first != header.round) continue;
        released.push_back(it->second);
        pushes.erase(it);
        break;
      }
      if (pushes.empty()) held_pushes_.erase(found);
    }
  }
  for (const ShmLocation& location : released) slots_->Release(location);
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
  status = peer_arenas_.Add(announcement.index, std::move(arena));
  return status.ok() ? status : Status::Error(status.message() + " (" + peer() + ")");
}

Status SharedMemoryChannel::Receive(FrameHeader* header, DataReader* payload, bool* eof) {
  while (true) {
    Status status = ReceiveFromSocket(header, payload, eof);
    if (!status.ok()) return status;
    OnPeerFrame(*header);
    const auto type = static_cast<FrameType>(header->type);
    if (type == FrameType::kFence || type == FrameType::kFenceAck) {
      if (header->length != 0) return Status::Error("a malformed fence from " + peer());
      continue;
    }
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
