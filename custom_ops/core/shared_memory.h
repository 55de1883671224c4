// Shared memory between a worker and a server on the same host. Tensor data then
// moves with one memcpy into a shared slot and the server sums straight from the
// slots, instead of crossing the kernel twice per byte as on a socket.
//
// Arenas are memfds: their descriptors travel over the Unix socket (SCM_RIGHTS), so
// nothing is named on disk and the memory goes away with the last process using it.
#ifndef TF_BPS_CORE_SHARED_MEMORY_H_
#define TF_BPS_CORE_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "protocol.h"

namespace bps {

class SharedArena {
 public:
  static Status Create(size_t bytes, std::unique_ptr<SharedArena>* out);
  // Maps an arena whose descriptor came from the peer; takes ownership of `fd`.
  static Status Map(int fd, size_t bytes, std::unique_ptr<SharedArena>* out);
  ~SharedArena();

  char* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  SharedArena(int fd, char* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  char* data_;
  size_t size_;
};

// Memory this process writes for its same-host peers to read: one slot per
// partition key, in arenas announced to each peer before it first needs them. A
// key's slot is reused round after round (a key is written again only once every
// reader has finished with its last round) and moves only when its size changes;
// slots are never freed, so a bump allocator over a growing list of arenas does.
// Thread-safe.
class SharedSlots {
 public:
  // The slot of `key`, `bytes` long.
  Status Slot(const PartitionKey& key, size_t bytes, char** data, ShmLocation* location);
  // Where [data, data + bytes) lies, if inside one of these arenas.
  bool Locate(const void* data, size_t bytes, ShmLocation* location) const;
  // Arena `index` as a peer learns of it, with its descriptor.
  ArenaAnnouncement Announcement(uint32_t index, int* fd) const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<SharedArena>> arenas_;
  size_t used_ = 0;  // in the last arena
  std::unordered_map<PartitionKey, ShmLocation, PartitionKeyHash> slots_;
};

// The peer's arenas, mapped as their descriptors arrive.
class PeerArenas {
 public:
  Status Add(uint32_t index, int fd, size_t bytes);
  // Null when the location is not inside an arena the peer announced.
  char* Resolve(const ShmLocation& location);

 private:
  std::mutex mutex_;
  std::unordered_map<uint32_t, std::unique_ptr<SharedArena>> arenas_;
};

}  // namespace bps

#endif  // TF_BPS_CORE_SHARED_MEMORY_H_
