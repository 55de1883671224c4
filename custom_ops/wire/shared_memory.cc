#include "shared_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <tuple>

namespace bps {
namespace {

constexpr size_t kArenaBytes = 64ull << 20;
constexpr size_t kSlotAlignment = 64;  // A cache line, so vector loops start aligned.
constexpr size_t kPageBytes = 4096;

size_t RoundUp(size_t value, size_t unit) { return (value + unit - 1) / unit * unit; }
size_t RoundDown(size_t value, size_t unit) { return value / unit * unit; }

}  // namespace

// Seals every arena carries before a peer maps it: its size is fixed, so that no peer
// can shrink it under our reads (they would fault). The seals themselves are final.
constexpr int kArenaSeals = F_SEAL_SHRINK | F_SEAL_GROW;

Status SharedArena::Create(size_t bytes, std::shared_ptr<SharedArena>* out) {
  // Named after the process that made it, so that its memory is told apart from the
  // peers' arenas it maps (tests/workers/memory.py).
  const std::string name = "tf_bps." + std::to_string(::getpid());
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::Error(std::string("memfd_create failed: ") + std::strerror(errno));
  std::string error;
  void* data = MAP_FAILED;
  int readable = -1;
  // Peers get a descriptor opened for reading only: they cannot map it writable, and
  // so cannot write into what this process hands to others. (A seal against writing
  // would also stop freed pages from being given back.)
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    error = "cannot size shared memory to " + std::to_string(bytes) + " bytes: ";
  } else if (::fcntl(fd, F_ADD_SEALS, kArenaSeals | F_SEAL_SEAL) != 0) {
    error = "cannot seal shared memory: ";
  } else if ((readable = ::open(path.c_str(), O_RDONLY | O_CLOEXEC)) < 0) {
    error = "cannot open shared memory for reading only: ";
  } else if ((data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) ==
             MAP_FAILED) {
    error = "cannot map shared memory: ";
  }
  if (!error.empty()) {
    error += std::strerror(errno);
    if (readable >= 0) ::close(readable);
    ::close(fd);
    return Status::Error(error);
  }
  ::close(fd);  // The read-only one keeps the memory, and our mapping writes it.
  out->reset(new SharedArena(readable, static_cast<char*>(data), bytes));
  return Status::OK();
}

Status SharedArena::Map(int fd, size_t bytes, std::shared_ptr<SharedArena>* out) {
  struct stat info;
  std::string error;
  const int seals = ::fcntl(fd, F_GET_SEALS);  // Fails on anything but a memfd.
  if (seals < 0 || (seals & kArenaSeals) != kArenaSeals) {
    error = "it is not shared memory sealed against resizing and writing";
  } else if (::fstat(fd, &info) != 0) {
    error = std::strerror(errno);
  } else if (bytes == 0 || static_cast<uint64_t>(info.st_size) < bytes) {
    error = "it holds " + std::to_string(info.st_size) + " bytes, not the " +
            std::to_string(bytes) + " announced";
  }
  // Read-only: what a peer made is read here, never written.
  void* data = error.empty() ? ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
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

size_t ArenaTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return arenas_.size();
}

Status SharedSlots::Slot(const SlotKey& key, size_t bytes, char** data, ShmLocation* location) {
  const auto now = std::chrono::steady_clock::now();
  const size_t wanted = RoundUp(std::max<size_t>(bytes, 1), kSlotAlignment);
  std::lock_guard<std::mutex> lock(mutex_);
  CollectIdleLocked(now);
  uint32_t arena = 0;
  uint64_t offset = 0;
  auto found = live_.find(key);
  if (found != live_.end()) {
    std::tie(arena, offset) = found->second;
    Record& record = arenas_[arena].records.at(offset);
    // Data that shrank to under a quarter of its slot moves, so that one large round
    // does not keep its memory for good.
    if (wanted > record.capacity || wanted < record.capacity / 4) {
      record.live = false;
      live_.erase(found);
      found = live_.end();
      MaybeFreeLocked(arena, offset);
    }
  }
  if (found == live_.end()) {
    Status status = AllocateLocked(wanted, &arena, &offset);
    if (!status.ok()) return status;
    Record record;
    record.key = key;
    record.capacity = wanted;
    arenas_[arena].records.emplace(offset, record);
    live_[key] = {arena, offset};
    used_ += wanted;
  }
  Record& record = arenas_[arena].records.at(offset);
  ++record.holders;
  record.last_used = now;
  *location = ShmLocation{arena, 0, offset, bytes};
  *data = arenas_[arena].memory->data() + offset;
  return Status::OK();
}

Status SharedSlots::AllocateLocked(size_t capacity, uint32_t* arena, uint64_t* offset) {
  // First fit: slots of a steady job keep their places, so little is ever cut.
  for (size_t a = 0; a < arenas_.size(); ++a) {
    for (auto it = arenas_[a].free.begin(); it != arenas_[a].free.end(); ++it) {
      if (it->second < capacity) continue;
      *arena = static_cast<uint32_t>(a);
      *offset = it->first;
      const uint64_t rest = it->second - capacity;
      arenas_[a].free.erase(it);
      if (rest) arenas_[a].free.emplace(*offset + capacity, rest);
      return Status::OK();
    }
  }
  std::shared_ptr<SharedArena> memory;
  Status status =
      SharedArena::Create(std::max(kArenaBytes, RoundUp(capacity, kArenaBytes)), &memory);
  if (!status.ok()) return status;
  *arena = table_->Add(memory);
  *offset = 0;
  arenas_.resize(*arena + 1);
  arenas_[*arena].memory = memory;
  if (memory->size() > capacity) arenas_[*arena].free.emplace(capacity, memory->size() - capacity);
  return Status::OK();
}

SharedSlots::Record* SharedSlots::FindLocked(const ShmLocation& location, uint32_t* arena,
                                             uint64_t* offset) {
  if (location.arena >= arenas_.size()) return nullptr;
  auto& records = arenas_[location.arena].records;
  auto it = records.upper_bound(location.offset);
  if (it == records.begin()) return nullptr;
  --it;
  if (location.offset + location.length > it->first + it->second.capacity) return nullptr;
  *arena = location.arena;
  *offset = it->first;
  return &it->second;
}

bool SharedSlots::Hold(const void* data, size_t bytes, ShmLocation* location) {
  const char* p = static_cast<const char*>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t a = 0; a < arenas_.size(); ++a) {
    const char* begin = arenas_[a].memory->data();
    if (p < begin || p >= begin + arenas_[a].memory->size()) continue;
    const ShmLocation where{static_cast<uint32_t>(a), 0, static_cast<uint64_t>(p - begin), bytes};
    uint32_t arena;
    uint64_t offset;
    Record* record = FindLocked(where, &arena, &offset);
    if (!record) return false;
    ++record->holders;
    *location = where;
    return true;
  }
  return false;
}

void SharedSlots::Release(const ShmLocation& location) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint32_t arena;
  uint64_t offset;
  Record* record = FindLocked(location, &arena, &offset);
  if (!record || record->holders == 0) return;
  --record->holders;
  MaybeFreeLocked(arena, offset);
}

void SharedSlots::Retire(uint64_t tensor_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->first.partition.tensor_id != tensor_id) {
      ++it;
      continue;
    }
    const auto [arena, offset] = it->second;
    it = live_.erase(it);
    arenas_[arena].records.at(offset).live = false;
    MaybeFreeLocked(arena, offset);
  }
}

void SharedSlots::MaybeFreeLocked(uint32_t arena, uint64_t offset) {
  const Record& record = arenas_[arena].records.at(offset);
  if (!record.live && record.holders == 0) FreeLocked(arena, offset);
}

void SharedSlots::FreeLocked(uint32_t arena, uint64_t offset) {
  Arena& a = arenas_[arena];
  auto record = a.records.find(offset);
  uint64_t begin = offset;
  uint64_t end = offset + record->second.capacity;
  used_ -= record->second.capacity;
  a.records.erase(record);
  // Coalesce with the free neighbours.
  auto next = a.free.lower_bound(begin);
  if (next != a.free.end() && next->first == end) {
    end += next->second;
    next = a.free.erase(next);
  }
  if (next != a.free.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == begin) {
      begin = previous->first;
      a.free.erase(previous);
    }
  }
  a.free.emplace(begin, end - begin);
  // The whole pages of the freed range go back to the system, for every process that
  // maps them; the range stays mapped, and reads as zeros until it is written again.
  const uint64_t first = RoundUp(std::max(begin, RoundDown(offset, kPageBytes)), kPageBytes);
  const uint64_t last = RoundDown(end, kPageBytes);
  // (Through our writable mapping: the descriptor we hold is the read-only one.)
  if (last > first) ::madvise(a.memory->data() + first, last - first, MADV_REMOVE);
}

void SharedSlots::CollectIdleLocked(std::chrono::steady_clock::time_point now) {
  if (now - last_collect_ <
      std::min<std::chrono::milliseconds>(idle_after_, std::chrono::seconds(1)))
    return;
  last_collect_ = now;
  const auto idle_since = now - idle_after_;
  for (auto it = live_.begin(); it != live_.end();) {
    const auto [arena, offset] = it->second;
    Record& record = arenas_[arena].records.at(offset);
    if (record.holders > 0 || record.last_used > idle_since) {
      ++it;
      continue;
    }
    it = live_.erase(it);
    record.live = false;
    FreeLocked(arena, offset);
  }
}

size_t SharedSlots::used_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

size_t SharedSlots::arena_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const Arena& a : arenas_) total += a.memory->size();
  return total;
}

Status PeerArenas::Add(uint32_t index, std::shared_ptr<SharedArena> arena) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (index >= kMaxPeerArenas)
    return Status::Error("announced shared memory number " + std::to_string(index) +
                         ", past the " + std::to_string(kMaxPeerArenas) + " a peer may map");
  arenas_[index] = std::move(arena);
  return Status::OK();
}

void PeerArenas::Clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  arenas_.clear();
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
