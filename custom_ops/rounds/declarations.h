// What each worker declared per tensor (kDeclare frames): the tensor's name in every
// message, the bytes a push of it may carry, and both sides of a mismatch. Shared by
// the server's readers and engines, and by a local merge's peers: thread-safe.
#ifndef TF_BPS_ROUNDS_DECLARATIONS_H_
#define TF_BPS_ROUNDS_DECLARATIONS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "../wire/protocol.h"

namespace bps {

class DeclarationBook {
 public:
  // Worker `rank`'s latest declaration of the tensor, made for its `round`.
  void Put(uint64_t tensor_id, uint32_t rank, Declaration declaration, uint32_t round = 0);
  // False if `rank` has declared nothing for the tensor.
  bool Find(uint64_t tensor_id, uint32_t rank, Declaration* declaration,
            uint32_t* round = nullptr) const;
  // "'name'" as `rank` (or, failing that, any worker) declared it; "with id N" if none did.
  std::string Describe(uint64_t tensor_id, uint32_t rank) const;
  // Why ranks `a` and `b` cannot take part in one round of the tensor.
  std::string Mismatch(uint64_t tensor_id, uint32_t a, uint32_t b) const;

 private:
  struct Entry {
    Declaration declaration;
    uint32_t round = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::pair<uint64_t, uint32_t>, Entry> entries_;  // by (tensor, rank)
};

}  // namespace bps

#endif  // TF_BPS_ROUNDS_DECLARATIONS_H_
