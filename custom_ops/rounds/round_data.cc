#include "round_data.h"

#include <algorithm>

namespace bps {
namespace {

constexpr size_t kMaxPooledBlocks = 64;

}  // namespace

BlockPool::Block BlockPool::Acquire(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity >= bytes) {
        Block block = std::move(free_[i]);
        free_[i] = std::move(free_.back());
        free_.pop_back();
        return block;
      }
    }
  }
  Block block;
  block.capacity = std::max<size_t>(bytes, 1);
  block.data.reset(new char[block.capacity]);  // Uninitialised: it is overwritten by a receive.
  return block;
}

void BlockPool::Release(Block block) {
  if (!block.data) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.size() < kMaxPooledBlocks) free_.push_back(std::move(block));
}

void RoundData::Clear(BlockPool* pool) {
  shared.clear();
  pool->Release(std::move(sum));
  pool->Release(std::move(reply));
  for (Contribution& c : by_rank) pool->Release(std::move(c.block));
  by_rank.clear();
}

}  // namespace bps
