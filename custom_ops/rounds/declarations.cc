#include "declarations.h"

namespace bps {

void DeclarationBook::Put(uint64_t tensor_id, uint32_t rank, Declaration declaration,
                          uint32_t round) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[{tensor_id, rank}] = Entry{std::move(declaration), round};
}

bool DeclarationBook::Find(uint64_t tensor_id, uint32_t rank, Declaration* declaration,
                           uint32_t* round) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = entries_.find({tensor_id, rank});
  if (found == entries_.end()) return false;
  if (declaration) *declaration = found->second.declaration;
  if (round) *round = found->second.round;
  return true;
}

std::string DeclarationBook::Describe(uint64_t tensor_id, uint32_t rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find({tensor_id, rank});
  // Another worker's name for it will do (a host's merged pushes come from its leaders).
  if (it == entries_.end()) it = entries_.lower_bound({tensor_id, 0});
  if (it == entries_.end() || it->first.first != tensor_id)
    return "with id " + std::to_string(tensor_id);
  return "'" + it->second.declaration.name + "'";
}

std::string DeclarationBook::Mismatch(uint64_t tensor_id, uint32_t a, uint32_t b) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto first = entries_.find({tensor_id, a});
  auto second = entries_.find({tensor_id, b});
  if (first == entries_.end() || second == entries_.end())
    return "workers sent tensor id " + std::to_string(tensor_id) + " with different sizes";
  return MismatchText(first->second.declaration, a, second->second.declaration, b);
}

}  // namespace bps
