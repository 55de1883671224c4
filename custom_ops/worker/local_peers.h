// The channels between the workers of one host, which the local merge talks over:
// Unix sockets in the abstract namespace (per network namespace, so each emulated
// host has its own), the job token proven both ways as with servers, and
// shared-memory channels, so that data crosses as locations. One receiving thread
// per peer hands each frame to the Receiver.
#ifndef TF_BPS_WORKER_LOCAL_PEERS_H_
#define TF_BPS_WORKER_LOCAL_PEERS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../common/common.h"
#include "../wire/protocol.h"
#include "../wire/transport.h"

namespace bps {

struct LocalMergeOptions {
  std::vector<int32_t> ranks;  // the workers of this host, ascending (this one included)
  int rank = 0;                // this worker's
  int size = 1;                // of the job
  std::string socket_prefix;   // a worker's socket: prefix + its rank
  // Proven both ways; these links stay in the clear even with BYTEPS_ENCRYPT, as
  // nothing on them leaves the host (tensor data lies in shared memory anyway).
  std::string token;
  int timeout_ms = 300000;
};

// The local index of the worker that leads partition `part` of a tensor among
// `count` workers of a host: it pushes the host's sum (local_merge.h, device_merge.h).
// Spread by tensor and partition, so that no one worker carries all the traffic.
inline int LocalLeader(uint64_t tensor_id, uint32_t part, size_t count) {
  return static_cast<int>((tensor_id % count + part) % count);
}

class LocalPeers {
 public:
  // Where the frames go: the local merge.
  class Receiver {
   public:
    virtual ~Receiver() = default;
    // A frame from peer `index`; an error ends that peer's connection.
    virtual Status OnFrame(int index, const FrameHeader& header, DataReader* payload) = 0;
    // Peer `index` said Bye (`failure` empty), or its connection broke (`failure` says how).
    virtual void OnPeerGone(int index, const std::string& failure) = 0;
  };
  struct Peer {
    Peer(int32_t rank, std::unique_ptr<Channel> channel);
    const int32_t rank;
    const std::string name;  // "worker rank R on this host"
    std::unique_ptr<Channel> channel;
    std::thread receiver;
    // The declaration hash this peer last heard per tensor (the local push stage's).
    std::unordered_map<uint64_t, uint64_t> declared;
  };

  LocalPeers(LocalMergeOptions options, std::shared_ptr<SharedSlots> slots);
  ~LocalPeers();

  // Connects to every other worker of the host, this one being local index `index`
  // (lower indices accept, higher ones connect). `cancel` ends the wait for slow peers.
  Status Connect(int index, Cancellation* cancel);
  void StartReceiving(Receiver* receiver);
  // By local index; null for this worker.
  Peer* peer(int index) const { return peers_[index].get(); }
  size_t size() const { return peers_.size(); }
  // Says Bye to every peer and ends the receiving threads; the peers stay readable.
  void Close();

 private:
  using Clock = std::chrono::steady_clock;
  // Connects to the lower-ranked peer listening on `name`, which must prove the token
  // before `deadline`; `give_up` says when to stop waiting for it to listen.
  Status ConnectToPeer(const std::string& name, const std::string& peer, Clock::time_point deadline,
                       const std::function<Status(const std::string&)>& give_up,
                       std::unique_ptr<Channel>* out);
  // Takes the host's higher-ranked peers on `listen_fd` through a waiting room: a
  // silent or slow connection costs them nothing but its place until its deadline.
  Status AdmitHigherPeers(int index, int listen_fd,
                          const std::function<Status(const std::string&)>& give_up);
  void ReceiveLoop(int index, Receiver* receiver);

  const LocalMergeOptions options_;
  const std::shared_ptr<SharedSlots> slots_;
  std::vector<std::unique_ptr<Peer>> peers_;
  bool closed_ = false;
};

}  // namespace bps

#endif  // TF_BPS_WORKER_LOCAL_PEERS_H_
