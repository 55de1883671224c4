// Shared memory between a worker and a server on the same host. Tensor data then
// moves with one memcpy into a shared slot and the server sums straight from the
// slots, instead of crossing the kernel twice per byte as on a socket.
//
// Arenas are memfds: their descriptors travel over the Unix socket (SCM_RIGHTS), so
// nothing is named on disk and the memory goes away with the last process using it.
#ifndef TF_BPS_CORE_TRANSPORT_SHARED_MEMORY_H_
#define TF_BPS_CORE_TRANSPORT_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "../common.h"
#include "../protocol.h"

namespace bps {

class SharedArena {
 public:
  static Status Create(size_t bytes, std::shared_ptr<SharedArena>* out);
  // Maps an arena whose descriptor came from a peer, which claims it holds `bytes`
  // (checked against the descriptor, so a lie cannot fault us later); takes `fd`.
  static Status Map(int fd, size_t bytes, std::shared_ptr<SharedArena>* out);
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

// The arenas a process can hand to its same-host peers, by index: its own and, on
// a server, those its workers announced, so that one worker's pushed rows reach
// another as a location instead of a copy. Thread-safe.
class ArenaTable {
 public:
  uint32_t Add(std::shared_ptr<SharedArena> arena);
  // Null past the end.
  std::shared_ptr<SharedArena> Get(uint32_t index) const;
  // Where [data, data + bytes) lies, if inside one of the arenas.
  bool Locate(const void* data, size_t bytes, ShmLocation* location) const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<SharedArena>> arenas_;
};

// Names a slot: a partition, and which of its copies. A sender whose data peers
// may still read when its next round starts (a broadcast root) alternates between
// two copies by round.
struct SlotKey {
  PartitionKey partition;
  uint32_t copy = 0;
  bool operator==(const SlotKey& other) const {
    return partition == other.partition && copy == other.copy;
  }
};

struct SlotKeyHash {
  size_t operator()(const SlotKey& key) const {
    return PartitionKeyHash()(key.partition) ^ (key.copy * 0xC2B2AE3D27D4EB4FULL);
  }
};

// Memory this process writes for its same-host peers to read: slots by SlotKey, in
// arenas of `table`. A slot is reused round after round (it is written again only
// once every reader has finished with it) and moves only when its size changes or
// it is retired; slots are never freed, so a bump allocator over a growing list of
// arenas does. Thread-safe.
class SharedSlots {
 public:
  explicit SharedSlots(std::shared_ptr<ArenaTable> table) : table_(std::move(table)) {}
  // The slot of `key`, `bytes` long.
  Status Slot(const SlotKey& key, size_t bytes, char** data, ShmLocation* location);
  // The tensor's next writes go to fresh slots: after a failed round a peer may
  // still be reading the old ones, and the usual ordering no longer protects them.
  void Retire(uint64_t tensor_id);
  ArenaTable& table() const { return *table_; }

 private:
  const std::shared_ptr<ArenaTable> table_;
  std::mutex mutex_;
  std::shared_ptr<SharedArena> current_;  // the arena slots are cut from
  uint32_t current_index_ = 0;
  size_t used_ = 0;  // in `current_`
  std::unordered_map<SlotKey, ShmLocation, SlotKeyHash> slots_;
};

// A peer's arenas by the peer's index, mapped as their descriptors arrive.
class PeerArenas {
 public:
  void Add(uint32_t index, std::shared_ptr<SharedArena> arena);
  // Null when the location is not inside an arena the peer announced.
  const char* Resolve(const ShmLocation& location);

 private:
  std::mutex mutex_;
  std::unordered_map<uint32_t, std::shared_ptr<SharedArena>> arenas_;
};

}  // namespace bps

#endif  // TF_BPS_CORE_TRANSPORT_SHARED_MEMORY_H_
