// The shared-memory transport, for a worker and a server (or two workers) on one
// host: a Unix socket carries the frames, and tensor data lies in memfd arenas that
// both sides map, so that only its location crosses the socket. BYTEPS_ENABLE_IPC
// lets workers take it (ServerAddress::same_host); a worker that cannot reach a
// server's Unix socket, or meets something else there, takes the next transport.
#ifndef TF_BPS_WIRE_SHM_SHARED_MEMORY_CHANNEL_H_
#define TF_BPS_WIRE_SHM_SHARED_MEMORY_CHANNEL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../shared_memory.h"
#include "../stream_channel.h"
#include "../transport.h"

namespace bps {

class SharedMemoryChannel : public StreamChannel {
 public:
  enum class Side {
    // Pushes not already in `slots` are copied into their partition's slot.
    kWorker,
    // Results in `slots` go as a location, anything else over the socket.
    kServer,
  };
  SharedMemoryChannel(std::unique_ptr<Connection> conn, std::shared_ptr<SharedSlots> slots,
                      Side side);
  ~SharedMemoryChannel() override;
  Status SendData(FrameHeader header, const void* data, const SlotKey& slot) override;
  Status Receive(FrameHeader* header, DataReader* payload, bool* eof) override;
  void RetireSlots(uint64_t tensor_id) override { slots_->Retire(tensor_id); }
  void ForgetPeerMemory() override { peer_arenas_.Clear(); }
  bool shares_memory() const override { return true; }

 protected:
  void SendControlLocked() override;

 private:
  // Maps an arena the peer announced (its descriptor came with the frame).
  Status AddPeerArena(const FrameHeader& header, DataReader* payload);
  // The location of `data` for the peer, in a slot held for it; false to send the
  // bytes themselves.
  bool Locate(const FrameHeader& header, const void* data, const SlotKey& slot,
              ShmLocation* location, Status* status);
  // Keeps `location` held until the peer is done with it (see below).
  void HoldForPeer(const FrameHeader& header, const ShmLocation& location);
  // Bookkeeping of a frame the peer sent: an answer lets go of its push; a fence is
  // acknowledged, an acknowledgement lets go of the replies it covers.
  void OnPeerFrame(const FrameHeader& header);

  const std::shared_ptr<SharedSlots> slots_;
  const Side side_;
  uint32_t announced_ = 0;  // Arenas of `slots_`' table the peer knows; guarded by write_mutex_.
  PeerArenas peer_arenas_;

  // What the peer was handed and may still read. A pushed location is read until
  // the push's round is answered (a reply or an error, exactly one per push). A
  // replied location is read by the peer's receiving thread before it takes the next
  // frame, so a fence sent after it and acknowledged proves it read; replies wait
  // for the next fence. One fence is out at a time; a receiving thread never sends
  // (a send can block on a peer that waits for it to read), so an acknowledgement
  // and a fence that is due go out before the next frame this side sends.
  std::mutex held_mutex_;
  std::unordered_map<PartitionKey, std::vector<std::pair<uint32_t, ShmLocation>>,
                     PartitionKeyHash>
      held_pushes_;                                            // by partition: (round, location)
  std::deque<std::pair<uint64_t, ShmLocation>> held_replies_;  // (covering fence, location)
  uint64_t fences_sent_ = 0;
  uint64_t fences_acknowledged_ = 0;
  bool fence_due_ = false;        // a reply waits for the next fence
  uint64_t acknowledgement_ = 0;  // the peer's latest fence, to acknowledge; 0: none
};

const Transport& SharedMemoryTransport();

}  // namespace bps

#endif  // TF_BPS_WIRE_SHM_SHARED_MEMORY_CHANNEL_H_
