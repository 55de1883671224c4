// Shared memory between a worker and a server on the same host. Tensor data then
// moves with one memcpy into a shared slot and the server sums straight from the
// slots, instead of crossing the kernel twice per byte as on a socket.
//
// Arenas are memfds: their descriptors travel over the Unix socket (SCM_RIGHTS), so
// nothing is named on disk and the memory goes away with the last process using it.
#ifndef TF_BPS_WIRE_SHARED_MEMORY_H_
#define TF_BPS_WIRE_SHARED_MEMORY_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "../common/common.h"
#include "protocol.h"

namespace bps {

class SharedArena {
 public:
  // Makes an arena of `bytes`, sealed against resizing, mapped writable here; its
  // descriptor (what peers are handed) is opened for reading only.
  static Status Create(size_t bytes, std::shared_ptr<SharedArena>* out);
  // Maps an arena whose descriptor came from a peer, which claims it holds `bytes`,
  // read-only: it must be a memfd sealed against resizing, and hold what it claims (so
  // a lie cannot fault us later); takes `fd`.
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

// The arenas a process hands to its same-host peers, by index (the index a peer
// learns with the arena's descriptor). Thread-safe.
class ArenaTable {
 public:
  uint32_t Add(std::shared_ptr<SharedArena> arena);
  // Null past the end.
  std::shared_ptr<SharedArena> Get(uint32_t index) const;
  size_t size() const;

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

// Memory this process writes for its same-host peers to read: a slot per SlotKey,
// cut from arenas of `table`.
//
// A slot is reused round after round (the round protocol lets a writer write it again
// only once every reader of the last round is done) and stays where it is while its
// data fits. Its memory is given back, the pages returned to the system, once
// nothing can read it any more: a slot is *held* while a writer fills it (Slot) and
// for each peer that was handed its location and has not said it is done (Hold,
// Release; the channels release a pushed location when its answer arrives, and
// replied ones when the peer acknowledges a fence, see SharedMemoryChannel). A slot
// nobody holds is freed when it is replaced (its key's data outgrew it or shrank
// well below it), retired (Retire) or idle (kIdleAfter); a replaced or retired
// slot that is still held goes when its last holder lets go. Thread-safe.
class SharedSlots {
 public:
  // A slot unused for this long, and held by nobody, is freed: a tensor whose name
  // is never used again (names made per step, say) gives its memory back.
  static constexpr std::chrono::milliseconds kIdleAfter{5000};

  explicit SharedSlots(std::shared_ptr<ArenaTable> table,
                       std::chrono::milliseconds idle_after = kIdleAfter)
      : table_(std::move(table)), idle_after_(idle_after) {}
  // The slot of `key`, `bytes` long, held for the caller until it calls Release.
  Status Slot(const SlotKey& key, size_t bytes, char** data, ShmLocation* location);
  // If [data, data + bytes) lies in one of the slots, holds that slot and says where
  // the data lies; false otherwise.
  bool Hold(const void* data, size_t bytes, ShmLocation* location);
  // Lets go of the slot `location` lies in (held by Slot or Hold).
  void Release(const ShmLocation& location);
  // The tensor's next writes go to fresh slots: after a failed round a peer may
  // still be reading the old ones, and the round protocol no longer protects them.
  // The old ones are freed once nobody holds them.
  void Retire(uint64_t tensor_id);
  // Bytes of slots in use (held, or live for their key), and of the arenas.
  size_t used_bytes() const;
  size_t arena_bytes() const;
  ArenaTable& table() const { return *table_; }

 private:
  struct Record {  // One slot, at its offset in its arena.
    SlotKey key;
    size_t capacity = 0;
    int holders = 0;
    bool live = true;  // still its key's slot
    std::chrono::steady_clock::time_point last_used;
  };
  struct Arena {
    std::shared_ptr<SharedArena> memory;
    std::map<uint64_t, Record> records;  // by offset
    std::map<uint64_t, uint64_t> free;   // offset -> length, coalesced
  };
  // Where a slot of `capacity` bytes fits, making an arena if none has room.
  Status AllocateLocked(size_t capacity, uint32_t* arena, uint64_t* offset);
  // The record `location` lies in; null if none.
  Record* FindLocked(const ShmLocation& location, uint32_t* arena, uint64_t* offset);
  // Frees the record if nothing needs it any more.
  void MaybeFreeLocked(uint32_t arena, uint64_t offset);
  void FreeLocked(uint32_t arena, uint64_t offset);
  // Frees the idle slots (looking at most once a second, or per idle_after_).
  void CollectIdleLocked(std::chrono::steady_clock::time_point now);

  const std::shared_ptr<ArenaTable> table_;
  const std::chrono::milliseconds idle_after_;
  mutable std::mutex mutex_;
  std::vector<Arena> arenas_;  // by table index
  std::unordered_map<SlotKey, std::pair<uint32_t, uint64_t>, SlotKeyHash> live_;
  size_t used_ = 0;
  std::chrono::steady_clock::time_point last_collect_{};
};

// Holds a slot (SharedSlots::Slot) for as long as it lives.
class SlotHold {
 public:
  SlotHold(std::shared_ptr<SharedSlots> slots, const ShmLocation& location)
      : slots_(std::move(slots)), location_(location) {}
  ~SlotHold() { slots_->Release(location_); }
  SlotHold(const SlotHold&) = delete;
  SlotHold& operator=(const SlotHold&) = delete;

 private:
  const std::shared_ptr<SharedSlots> slots_;
  const ShmLocation location_;
};

// A peer's arenas by the peer's index, mapped as their descriptors arrive.
class PeerArenas {
 public:
  // A peer's arenas are numbered from 0 and at most this many (64 MiB each at least:
  // far more than any tensor needs), so that no peer makes us hold any number of
  // descriptors and mappings.
  static constexpr uint32_t kMaxPeerArenas = 4096;
  // An index already held is replaced; one past the cap is refused.
  Status Add(uint32_t index, std::shared_ptr<SharedArena> arena);
  // Null when the location is not inside an arena the peer announced.
  const char* Resolve(const ShmLocation& location);
  // Unmaps them all: what the peer made is no longer read here.
  void Clear();

 private:
  std::mutex mutex_;
  std::unordered_map<uint32_t, std::shared_ptr<SharedArena>> arenas_;
};

}  // namespace bps

#endif  // TF_BPS_WIRE_SHARED_MEMORY_H_
