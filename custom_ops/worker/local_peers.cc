#include "local_peers.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "../common/logging.h"
#include "../wire/auth.h"
#include "../wire/shm/shared_memory_channel.h"
#include "../wire/socket.h"
#include "../wire/waiting_room.h"

namespace bps {
namespace {

// How long a connection to this worker's local socket has to prove the token.
constexpr int kIntroductionDeadlineMs = 10000;

}  // namespace

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
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  const int timeout_s = options_.timeout_ms / 1000;
  std::string why;
  const std::function<Status(const std::string&)> give_up = [&](const std::string& waiting_for) {
    if (cancel && cancel->cancelled(&why)) return Status::Error(ErrorKind::kAborted, why);
    if (Clock::now() < deadline) return Status::OK();
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
    const std::string peer = "worker rank " + std::to_string(ranks[j]) + " on this host";
    std::unique_ptr<Channel> channel;
    Status status = ConnectToPeer(options_.socket_prefix + std::to_string(ranks[j]), peer,
                                  deadline, give_up, &channel);
    if (!status.ok()) return status;
    peers_[j] = std::make_unique<Peer>(ranks[j], std::move(channel));
  }
  return higher > 0 ? AdmitHigherPeers(index, listen_fd, give_up) : Status::OK();
}

Status LocalPeers::ConnectToPeer(const std::string& name, const std::string& peer,
                                 Clock::time_point deadline,
                                 const std::function<Status(const std::string&)>& give_up,
                                 std::unique_ptr<Channel>* out) {
  int fd = -1;
  while (!ConnectLocal(name, options_.timeout_ms, &fd).ok()) {
    Status status = give_up(peer + " to listen on its local socket");
    if (!status.ok()) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto connection = std::make_unique<Connection>(fd, peer);
  // Whoever holds the name must prove the job token before it sees any data, all
  // within one handshake's time.
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  Status status = AuthenticateServer(*connection, options_.token, options_.rank,
                                     static_cast<int>(std::max<int64_t>(left.count(), 1)));
  if (!status.ok())
    return Status::Error(ErrorKind::kPeerGone, "the local socket of " + peer +
                                                   " is not that worker's: " + status.message());
  *out = std::make_unique<SharedMemoryChannel>(std::move(connection), slots_,
                                               SharedMemoryChannel::Side::kWorker);
  return Status::OK();
}

Status LocalPeers::AdmitHigherPeers(int index, int listen_fd,
                                    const std::function<Status(const std::string&)>& give_up) {
  const auto& ranks = options_.ranks;
  WaitingRoom::Options options;
  options.secret = options_.token;
  options.num_workers = options_.size;
  options.deadline_ms = std::min(options_.timeout_ms, kIntroductionDeadlineMs);
  WaitingRoom room(std::move(options));
  std::vector<pollfd> watched;
  std::vector<WaitingRoom::Proven> proven;
  for (int higher = static_cast<int>(ranks.size()) - 1 - index; higher > 0;) {
    watched.assign(1, pollfd{listen_fd, POLLIN, 0});
    room.Watch(&watched);
    ::poll(watched.data(), watched.size(), std::min(100, room.MsUntilNextDeadline()));
    room.Serve(watched, &proven);
    for (WaitingRoom::Proven& worker : proven) {
      const auto at = std::find(ranks.begin(), ranks.end(), static_cast<int32_t>(worker.rank));
      const int j = static_cast<int>(at - ranks.begin());
      if (j <= index || j >= static_cast<int>(ranks.size()) || peers_[j]) {
        BPS_LOG(kWarning) << "refused a local connection: rank " << worker.rank
                          << " is not expected to connect here";
        continue;  // Closes it.
      }
      auto channel = std::make_unique<SharedMemoryChannel>(std::move(worker.connection), slots_,
                                                           SharedMemoryChannel::Side::kWorker);
      peers_[j] = std::make_unique<Peer>(static_cast<int32_t>(worker.rank), std::move(channel));
      --higher;
    }
    proven.clear();
    if (watched[0].revents & POLLIN) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      Status trusted = fd >= 0 ? CheckLocalPeer(fd) : Status::OK();
      if (!trusted.ok()) {
        BPS_LOG(kWarning) << "refused a local connection: " << trusted.message();
        ::close(fd);
      } else if (fd >= 0) {
        ConfigureSocket(fd, options_.timeout_ms);
        room.Enter(std::make_unique<Connection>(fd, "a process on this host"), "local", 0);
      }
    }
    if (higher == 0) break;
    Status status = give_up("the workers of its host with higher ranks to connect");
    if (!status.ok()) return status;
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
