#include "local_peers.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "../common/logging.h"
#include "../wire/auth.h"
#include "../wire/socket.h"

namespace bps {

LocalPeers::Peer::Peer(int32_t rank, std::unique_ptr<Channel> channel)
    : rank(rank),
      name("worker rank " + std::to_string(rank) + " on this host"),
      channel(std::move(channel)) {}

LocalPeers::LocalPeers(LocalMergeOptions options, std::shared_ptr<SharedSlots> slots)
    : options_(std::move(options)), slots_(std::move(slots)) {}

LocalPeers::~LocalPeers() { Close(); }

Status LocalPeers::Connect(int index, Cancellation* cancel) {
  peers_.clear();
  peers_.resize(options_.ranks.size());
  const auto& ranks = options_.ranks;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  const int timeout_s = options_.timeout_ms / 1000;
  std::string why;
  auto give_up = [&](const std::string& waiting_for) {
    if (cancel && cancel->cancelled(&why)) return Status::Error(ErrorKind::kAborted, why);
    if (std::chrono::steady_clock::now() < deadline) return Status::OK();
    return Status::Error(ErrorKind::kPeerGone, "worker rank " + std::to_string(options_.rank) +
                                                   " waited " + std::to_string(timeout_s) +
                                                   " s for " + waiting_for +
                                                   " (see BYTEPS_OP_TIMEOUT)");
  };
  // Lower local indices accept, higher ones connect: every pair gets one channel.
  const int higher = static_cast<int>(ranks.size()) - 1 - index;
  int listen_fd = -1;
  if (higher > 0) {
    Status status = ListenLocal(options_.socket_prefix + std::to_string(options_.rank), &listen_fd);
    if (!status.ok()) return status.WithSuffix(" (for the other workers of this host)");
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{listen_fd};
  for (int j = 0; j < index; ++j) {
    const std::string name = options_.socket_prefix + std::to_string(ranks[j]);
    const std::string peer = "worker rank " + std::to_string(ranks[j]) + " on this host";
    int fd = -1;
    while (!ConnectLocal(name, options_.timeout_ms, &fd).ok()) {
      Status status = give_up(peer + " to listen on its local socket");
      if (!status.ok()) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    auto channel = std::make_unique<SharedMemoryChannel>(
        std::make_unique<Connection>(fd, peer), slots_, SharedMemoryChannel::Side::kWorker);
    // Whoever holds the name must prove the job token before it sees any data.
    Status status =
        AuthenticateServer(*channel, options_.token, options_.rank, options_.timeout_ms);
    if (!status.ok())
      return Status::Error(ErrorKind::kPeerGone, "the local socket of " + peer +
                                                     " is not that worker's: " + status.message());
    peers_[j] = std::make_unique<Peer>(ranks[j], std::move(channel));
  }
  for (int accepted = 0; accepted < higher;) {
    pollfd waiting{listen_fd, POLLIN, 0};
    if (::poll(&waiting, 1, 100) <= 0) {
      Status status = give_up("the workers of its host with higher ranks to connect");
      if (!status.ok()) return status;
      continue;
    }
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ConfigureSocket(fd, options_.timeout_ms);
    auto channel = std::make_unique<SharedMemoryChannel>(
        std::make_unique<Connection>(fd, "a process on this host"), slots_,
        SharedMemoryChannel::Side::kWorker);
    uint32_t rank = 0;
    Status status =
        AuthenticateWorker(*channel, options_.token, options_.size, options_.timeout_ms, &rank);
    const auto at = std::find(ranks.begin(), ranks.end(), static_cast<int32_t>(rank));
    const int j = static_cast<int>(at - ranks.begin());
    if (status.ok() && (j <= index || j >= static_cast<int>(ranks.size()) || peers_[j]))
      status = Status::Error("rank " + std::to_string(rank) + " is not expected to connect here");
    if (!status.ok()) {
      BPS_LOG(kWarning) << "refused a local connection: " << status.message();
      continue;  // Closes it.
    }
    peers_[j] = std::make_unique<Peer>(static_cast<int32_t>(rank), std::move(channel));
    ++accepted;
  }
  return Status::OK();
}

void LocalPeers::StartReceiving(Receiver* receiver) {
  for (size_t i = 0; i < peers_.size(); ++i)
    if (peers_[i])
      peers_[i]->receiver =
          std::thread([this, i, receiver] { ReceiveLoop(static_cast<int>(i), receiver); });
}

void LocalPeers::ReceiveLoop(int index, Receiver* receiver) {
  Peer& peer = *peers_[index];
  while (true) {
    FrameHeader header;
    DataReader payload;
    bool eof = false;
    Status status = peer.channel->Receive(&header, &payload, &eof);
    if (status.ok() && header.type == static_cast<uint8_t>(FrameType::kBye)) {
      receiver->OnPeerGone(index, "");
      return;
    }
    if (status.ok()) status = receiver->OnFrame(index, header, &payload);
    if (!status.ok()) {
      receiver->OnPeerGone(index, status.message() + " (from " + peer.name + ")");
      return;
    }
  }
}

void LocalPeers::Close() {
  if (closed_) return;
  closed_ = true;
  for (auto& peer : peers_) {
    if (!peer) continue;
    FrameHeader bye;
    bye.type = static_cast<uint8_t>(FrameType::kBye);
    bye.rank = static_cast<uint32_t>(options_.rank);
    peer->channel->Send(bye, nullptr);  // Best effort: the peer may be gone already.
    peer->channel->Shutdown();          // Wakes this side's receiver.
  }
  for (auto& peer : peers_)
    if (peer && peer->receiver.joinable()) peer->receiver.join();
}

}  // namespace bps
