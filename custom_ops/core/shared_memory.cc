#include "shared_memory.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace bps {
namespace {

constexpr size_t kArenaBytes = 64ull << 20;
constexpr size_t kSlotAlignment = 64;  // A cache line, so vector loops start aligned.

}  // namespace

Status SharedArena::Create(size_t bytes, std::unique_ptr<SharedArena>* out) {
  int fd = ::memfd_create("tf_bps", MFD_CLOEXEC);
  if (fd < 0) return Status::Error(std::string("memfd_create failed: ") + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::string error = std::strerror(errno);
    ::close(fd);
    return Status::Error("cannot size shared memory to " + std::to_string(bytes) +
                         " bytes: " + error);
  }
  return Map(fd, bytes, out);
}

Status SharedArena::Map(int fd, size_t bytes, std::unique_ptr<SharedArena>* out) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    std::string error = std::strerror(errno);
    ::close(fd);
    return Status::Error("cannot map shared memory: " + error);
  }
  out->reset(new SharedArena(fd, static_cast<char*>(data), bytes));
  return Status::OK();
}

SharedArena::~SharedArena() {
  ::munmap(data_, size_);
  ::close(fd_);
}

Status SharedSlots::Slot(const PartitionKey& key, size_t bytes, char** data,
                         ShmLocation* location) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = slots_.find(key);
  if (found == slots_.end() || found->second.length != bytes) {
    const size_t rounded =
        (std::max<size_t>(bytes, 1) + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
    if (arenas_.empty() || used_ + rounded > arenas_.back()->size()) {
      std::unique_ptr<SharedArena> arena;
      Status status = SharedArena::Create(std::max(kArenaBytes, rounded), &arena);
      if (!status.ok()) return status;
      arenas_.push_back(std::move(arena));
      used_ = 0;
    }
    const ShmLocation fresh{static_cast<uint32_t>(arenas_.size() - 1), 0, used_, bytes};
    used_ += rounded;
    found = slots_.insert_or_assign(key, fresh).first;
  }
  *location = found->second;
  *data = arenas_[location->arena]->data() + location->offset;
  return Status::OK();
}

bool SharedSlots::Locate(const void* data, size_t bytes, ShmLocation* location) const {
  const char* p = static_cast<const char*>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < arenas_.size(); ++i) {
    const char* begin = arenas_[i]->data();
    if (p >= begin && p < begin + arenas_[i]->size() &&
        bytes <= static_cast<size_t>(begin + arenas_[i]->size() - p)) {
      *location = ShmLocation{static_cast<uint32_t>(i), 0, static_cast<uint64_t>(p - begin), bytes};
      return true;
    }
  }
  return false;
}

ArenaAnnouncement SharedSlots::Announcement(uint32_t index, int* fd) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (index >= arenas_.size()) {
    *fd = -1;
    return ArenaAnnouncement{index, 0, 0};
  }
  *fd = arenas_[index]->fd();
  return ArenaAnnouncement{index, 0, arenas_[index]->size()};
}

Status PeerArenas::Add(uint32_t index, int fd, size_t bytes) {
  std::unique_ptr<SharedArena> arena;
  Status status = SharedArena::Map(fd, bytes, &arena);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(mutex_);
  arenas_[index] = std::move(arena);
  return Status::OK();
}

char* PeerArenas::Resolve(const ShmLocation& location) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = arenas_.find(location.arena);
  if (it == arenas_.end() || location.offset > it->second->size() ||
      location.length > it->second->size() - location.offset)
    return nullptr;
  return it->second->data() + location.offset;
}

}  // namespace bps
