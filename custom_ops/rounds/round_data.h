// What a server's round holds until it ends: the workers' pushes (in blocks read off
// a socket, or where they lie in the pusher's shared memory), and the result as it
// builds up. Blocks are recycled so that steady-state training allocates nothing.
#ifndef TF_BPS_ROUNDS_ROUND_DATA_H_
#define TF_BPS_ROUNDS_ROUND_DATA_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "../common/common.h"
#include "../compression/registry.h"
#include "../wire/protocol.h"

namespace bps {

class BlockPool {
 public:
  struct Block {
    std::unique_ptr<char[]> data;
    size_t capacity = 0;
  };
  // Throws std::bad_alloc when memory runs out.
  Block Acquire(size_t bytes);
  void Release(Block block);

 private:
  std::mutex mutex_;
  std::vector<Block> free_;
};

// One worker's push.
struct Contribution {
  BlockPool::Block block;        // data received over a socket, or
  const char* shared = nullptr;  // data in the sender's shared memory (same host)
  size_t length = 0;
  int64_t rows = 0;  // gathers: the sender's first dimension
  const char* data() const { return shared ? shared : block.data.get(); }
};

// What every push of a round must agree on, as its first push set it.
struct RoundSpec {
  OpKind kind = OpKind::kPushPull;
  uint8_t dtype = 0;
  ReduceOp reduce_op = ReduceOp::kSum;
  uint64_t signature = 0;
  int32_t owner = -1;        // the one rank the result goes to; -1: every contributor
  uint32_t process_set = 0;  // 0: every worker
  size_t length = 0;         // reductions: every push's length (compressed: decompressed)
  // kCompressedPushPull: the compressor the declarations name (pushes arrive
  // decompressed; the result leaves compressed).
  const CompressionSetup* compression = nullptr;
};

struct RoundData {
  RoundSpec spec;
  BlockPool::Block sum;               // reductions: the sum of socket pushes
  BlockPool::Block reply;             // a result built at the end (gathers, compressed sums)
  std::vector<const char*> shared;    // reductions: shared-memory pushes, reduced at the end
  std::vector<Contribution> by_rank;  // broadcast and gathers: each worker's push
  // Returns every block to `pool` and forgets the pushes.
  void Clear(BlockPool* pool);
};

}  // namespace bps

#endif  // TF_BPS_ROUNDS_ROUND_DATA_H_
