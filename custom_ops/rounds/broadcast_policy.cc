// Broadcast rounds: the root pushes its data, every other member an empty push that
// asks for it.
#include <cstring>

#include "policy.h"

namespace bps {
namespace {

const Contribution* RootOf(const RoundData& data) {
  const Contribution* root = nullptr;
  for (const Contribution& c : data.by_rank)
    if (c.length) root = &c;
  return root;
}

class Broadcast : public ByRankPolicy {
 public:
  std::string Unfinishable(const RoundData& data, const std::string& tensor) const override {
    if (RootOf(data)) return "";
    return "the root of broadcast " + tensor + " has joined (bps.join) and sends nothing";
  }

  const char* Result(RoundData* data, const ResultContext& context, ResultMemory* memory,
                     size_t* length) const override {
    const Contribution* root = RootOf(*data);
    *length = root ? root->length : 0;
    if (!root) return "";  // Unfinishable() ends such a round first.
    // Same-host receivers read a copy in the server's memory: a worker's own memory
    // is read only by its server, so that it knows when nobody reads it any more.
    if (!context.local_reader) return root->data();
    char* out = memory->Shared(root->length);
    if (out) std::memcpy(out, root->data(), root->length);
    return out;
  }

  bool Receives(const RoundData& data, uint32_t rank) const override {
    return data.by_rank[rank].length == 0;  // Everyone but the root.
  }
};

}  // namespace

const RoundPolicy& BroadcastPolicy() {
  static const Broadcast policy;
  return policy;
}

}  // namespace bps
