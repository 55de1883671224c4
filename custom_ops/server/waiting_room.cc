// A server's door: the acceptor thread takes connections, challenges each, and keeps
// those that have not yet said which worker they are in a waiting room that costs no
// thread (one poll over all of them), bounded in all and per source address, each
// with a deadline for its whole introduction however slowly it trickles. A worker
// that proves the job token gets a reader thread (server.cc).
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "../common/logging.h"
#include "server.h"

namespace bps {
namespace {

// A connection has its introduction's deadline to say which worker it is, and only so
// many may be waiting to, so that strangers cannot hold descriptors.
constexpr size_t kMaxUnintroduced = 64;
constexpr size_t kMaxUnintroducedPerSource = 16;
// How long a connection that sent part of its hello is left alone before another look.
constexpr int kPartialHelloQuietMs = 100;

// "10.0.0.2" of "10.0.0.2:4000"; the Unix socket's peers are "local".
std::string SourceOf(const Channel& channel) {
  if (channel.shares_memory()) return "local";
  const std::string& peer = channel.peer();
  return peer.substr(0, peer.rfind(':'));
}

// Whether a hello that has not all arrived yet is worth waiting for: the part that
// came (`arrived` bytes) is a hello's header, or less than one. Anything else is
// refused at once.
bool HelloStillComing(const Channel& channel, int arrived) {
  if (static_cast<size_t>(arrived) < sizeof(FrameHeader)) return true;
  FrameHeader header;
  if (::recv(channel.fd(), &header, sizeof(header), MSG_PEEK | MSG_DONTWAIT) !=
      static_cast<ssize_t>(sizeof(header)))
    return false;
  return header.magic == kFrameMagic && header.type == static_cast<uint8_t>(FrameType::kHello) &&
         header.length == kHelloFrameBytes - sizeof(FrameHeader);
}

}  // namespace

void Server::AcceptLoop() {
  const std::vector<int> listening = listener_.fds();
  std::vector<pollfd> watched;
  std::vector<size_t> place;  // of each watched waiting connection in waiting_
  while (!stopping_) {
    watched.clear();
    place.clear();
    for (int fd : listening) watched.push_back({fd, POLLIN, 0});
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < waiting_.size(); ++i) {
      if (waiting_[i].quiet_until > now) continue;
      watched.push_back({waiting_[i].channel->fd(), POLLIN, 0});
      place.push_back(i);
    }
    if (::poll(watched.data(), watched.size(), MsUntilNextDeadline()) < 0 && errno != EINTR) break;
    // Backwards: an introduction leaves the room, and the places before it stay.
    for (size_t i = place.size(); i-- > 0;)
      if (watched[listening.size() + i].revents) Introduce(place[i]);
    DropOverdue();
    {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      ReapReaders();
    }
    bool knocked = false;
    for (size_t i = 0; i < listening.size(); ++i) knocked |= watched[i].revents != 0;
    if (knocked && !AcceptNewcomers()) break;  // Stop() closed the listener.
  }
  waiting_.clear();  // Closes them.
}

int Server::MsUntilNextDeadline() const {
  // At least every second: Stop() and finished readers are looked at then.
  auto wait = std::chrono::milliseconds(1000);
  const auto now = std::chrono::steady_clock::now();
  const auto until = [&](std::chrono::steady_clock::time_point then) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(then - now);
    wait =
        std::max(std::chrono::milliseconds(0), std::min(wait, left + std::chrono::milliseconds(1)));
  };
  for (const Waiting& waiting : waiting_) {
    until(waiting.accepted_at + std::chrono::milliseconds(options_.hello_deadline_ms));
    if (waiting.quiet_until > now) until(waiting.quiet_until);
  }
  return static_cast<int>(wait.count());
}

bool Server::AcceptNewcomers() {
  // A bounded batch per wake-up: a flood of connections must not starve the
  // introductions of those already waiting.
  for (int batch = 0; batch < 256; ++batch) {
    std::unique_ptr<Channel> channel;
    Status status = listener_.Accept(&channel, 0);
    if (status.kind() == ErrorKind::kTimeout) return true;
    if (!status.ok()) return false;
    const std::string source = SourceOf(*channel);
    if (!Admits(source)) {
      BPS_LOG(kWarning) << "refusing a connection from " << channel->peer()
                        << ": others have not said who they are yet (at most "
                        << kMaxUnintroducedPerSource << " may wait from " << source << ", "
                        << kMaxUnintroduced << " in all)";
      continue;  // Closes it.
    }
    Waiting waiting{std::move(channel), source, std::chrono::steady_clock::now(), {}};
    status = ChallengeWorker(*waiting.channel, &waiting.challenge);
    if (!status.ok()) {
      BPS_LOG(kWarning) << "dropping connection from " << waiting.channel->peer() << ": "
                        << status.message();
      continue;
    }
    waiting_.push_back(std::move(waiting));
  }
  return true;
}

void Server::Introduce(size_t index) {
  const int arrived = waiting_[index].channel->BytesArrived();
  if (arrived > 0 && static_cast<size_t>(arrived) < kHelloFrameBytes &&
      HelloStillComing(*waiting_[index].channel, arrived)) {
    // Part of a hello: the rest may come before the deadline (a trickle never does).
    waiting_[index].quiet_until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kPartialHelloQuietMs);
    return;
  }
  Waiting waiting = std::move(waiting_[index]);
  waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(index));
  Channel& channel = *waiting.channel;
  // The hello is here (or the peer closed): reading it does not wait. The timeout only
  // guards the acceptor against a frame that is not what it seems.
  channel.SetReceiveTimeout(100);
  uint32_t rank = 0;
  Status status = WelcomeWorker(channel, JobSecret(options_.token, options_.encrypt), num_workers_,
                                waiting.challenge, &rank);
  if (!status.ok()) {
    BPS_LOG(kWarning) << "dropping connection from " << channel.peer() << ": " << status.message();
    return;
  }
  auto conn = std::make_shared<WorkerConn>(std::move(waiting.channel));
  std::lock_guard<std::mutex> lock(conns_mutex_);
  if (conns_[rank]) {
    // The scheduler gives each rank to one worker: this is not one of the job's.
    BPS_LOG(kWarning) << "dropping connection from " << conn->channel->peer() << ": it claims rank "
                      << rank << ", which " << conns_[rank]->channel->peer() << " holds";
    return;
  }
  conn->rank = static_cast<int>(rank);
  conns_[rank] = conn;
  BPS_LOG(kDebug) << "worker rank " << rank << " connected from " << conn->channel->peer();
  readers_.push_back(Reader{conn, std::thread([this, conn] {
                              ReadLoop(conn);
                              conn->finished = true;
                            })});
}

void Server::DropOverdue() {
  const auto now = std::chrono::steady_clock::now();
  const auto deadline = std::chrono::milliseconds(options_.hello_deadline_ms);
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (now - it->accepted_at <= deadline) {
      ++it;
      continue;
    }
    BPS_LOG(kWarning) << "dropping connection from " << it->channel->peer()
                      << ": it did not introduce itself within "
                      << options_.hello_deadline_ms / 1000.0 << " s";
    it = waiting_.erase(it);
  }
}

void Server::ReapReaders() {
  for (auto it = readers_.begin(); it != readers_.end();) {
    if (!it->conn->finished) {
      ++it;
      continue;
    }
    it->thread.join();
    it = readers_.erase(it);  // A worker's connection lives on in conns_.
  }
}

bool Server::Named(const std::string& source) const {
  return std::find(named_sources_.begin(), named_sources_.end(), source) != named_sources_.end();
}

bool Server::Admits(const std::string& source) {
  size_t from_source = 0;
  auto longest_stranger = waiting_.end();
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    from_source += it->source == source;
    if (!Named(it->source) &&
        (longest_stranger == waiting_.end() || it->accepted_at < longest_stranger->accepted_at))
      longest_stranger = it;
  }
  if (from_source >= kMaxUnintroducedPerSource) return false;
  if (waiting_.size() < kMaxUnintroduced) return true;
  if (longest_stranger == waiting_.end() || !Named(source)) return false;
  BPS_LOG(kWarning) << "dropping connection from " << longest_stranger->channel->peer()
                    << ": the waiting room is full, and a worker's address (" << source
                    << ") comes before a stranger's";
  waiting_.erase(longest_stranger);
  return true;
}

}  // namespace bps
