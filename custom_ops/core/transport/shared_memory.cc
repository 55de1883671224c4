#include "shared_memory.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace bps {
namespace {

constexpr size_t kArenaBytes = 64ull << 20;
constexpr size_t kSlotAlignment = 64;  // A cache line, so vector loops start aligned.

}  // namespace

Status SharedArena::Create(size_t bytes, std::shared_ptr<SharedArena>* out) {
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

Status SharedArena::Map(int fd, size_t bytes, std::shared_ptr<SharedArena>* out) {
  struct stat info;
  std::string error;
  if (::fstat(fd, &info) != 0) {
    error = std::strerror(errno);
  } else if (bytes == 0 || static_cast<uint64_t>(info.st_size) < bytes) {
    error = "it holds " + std::to_string(info.st_size) + " bytes, not the " +
            std::to_string(bytes) + " announced";
  }
  void* data = error.empty() ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                             : MAP_FAILED;
  if (data == MAP_FAILED) {
    if (error.empty()) error = std::strerror(errno);
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

uint32_t ArenaTable::Add(std::shared_ptr<SharedArena> arena) {
  std::lock_guard<std::mutex> lock(mutex_);
  arenas_.push_back(std::move(arena));
  return static_cast<uint32_t>(arenas_.size() - 1);
}

std::shared_ptr<SharedArena> ArenaTable::Get(uint32_t index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return index < arenas_.size() ? arenas_[index] : nullptr;
}

bool ArenaTable::Locate(const void* data, size_t bytes, ShmLocation* location) const {
  const char* p = static_cast<const char*>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < arenas_.size(); ++i) {
    const char* begin = arenas_[i]->data();
    const char* end = begin + arenas_[i]->size();
    if (p >= begin && p < end && bytes <= static_cast<size_t>(end - p)) {
      *location = ShmLocation{static_cast<uint32_t>(i), 0, static_cast<uint64_t>(p - begin), bytes};
      return true;
    }
  }
  return false;
}

Status SharedSlots::Slot(const SlotKey& key, size_t bytes, char** data, ShmLocation* location) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = slots_.find(key);
  if (found == slots_.end() || found->second.length != bytes) {
    const size_t rounded =
        (std::max<size_t>(bytes, 1) + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
    if (!current_ || used_ + rounded > current_->size()) {
      Status status = SharedArena::Create(std::max(kArenaBytes, rounded), &current_);
      if (!status.ok()) return status;
      current_index_ = table_->Add(current_);
      used_ = 0;
    }
    const ShmLocation fresh{current_index_, 0, used_, bytes};
    used_ += rounded;
    found = slots_.insert_or_assign(key, fresh).first;
  }
  *location = found->second;
  *data = table_->Get(location->arena)->data() + location->offset;
  return Status::OK();
}

void SharedSlots::Retire(uint64_t tensor_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = slots_.begin(); it != slots_.end();)
    it = it->first.partition.tensor_id == tensor_id ? slots_.erase(it) : std::next(it);
}

void PeerArenas::Add(uint32_t index, std::shared_ptr<SharedArena> arena) {
  std::lock_guard<std::mutex> lock(mutex_);
  arenas_[index] = std::move(arena);
}

const char* PeerArenas::Resolve(const ShmLocation& location) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = arenas_.find(location.arena);
  if (it == arenas_.end() || location.offset > it->second->size() ||
      location.length > it->second->size() - location.offset)
    return nullptr;
  return it->second->data() + location.offset;
}

}  // namespace bps
