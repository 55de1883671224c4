#include "waiting_room.h"

#include <sys/socket.h>

#include <algorithm>

#include "../common/logging.h"
#include "auth.h"

namespace bps {
namespace {

using Clock = std::chrono::steady_clock;

// How long a connection that sent part of its hello is left alone before another look.
constexpr auto kPartialHelloQuiet = std::chrono::milliseconds(100);
// Lines per source and window, and how many sources are remembered at most.
constexpr auto kLogWindow = std::chrono::seconds(30);
constexpr int kLinesPerWindow = 3;
constexpr size_t kMaxLogSources = 1024;

// Whether a hello that has not all arrived yet is worth waiting for: the part that
// came (`arrived` bytes) is a hello's header, or less than one. Anything else is
// refused at once, unread.
bool HelloStillComing(const Connection& connection, int arrived) {
  if (static_cast<size_t>(arrived) < sizeof(FrameHeader)) return true;
  FrameHeader header;
  if (::recv(connection.fd(), &header, sizeof(header), MSG_PEEK | MSG_DONTWAIT) !=
      static_cast<ssize_t>(sizeof(header)))
    return false;
  return header.magic == kFrameMagic && header.type == static_cast<uint8_t>(FrameType::kHello) &&
         header.length == kHelloFrameBytes - sizeof(FrameHeader);
}

}  // namespace

void RateLimitedLog::Warn(const std::string& source, const std::string& text) {
  const auto now = Clock::now();
  if (windows_.size() >= kMaxLogSources && !windows_.count(source)) {
    Flush();
    if (windows_.size() >= kMaxLogSources) return;  // A flood of sources: they wait.
  }
  Window& window = windows_.try_emplace(source, Window{now, 0, 0}).first->second;
  if (window.logged++ < kLinesPerWindow) {
    BPS_LOG(kWarning) << text;
  } else {
    ++window.suppressed;
  }
}

void RateLimitedLog::Flush() {
  const auto now = Clock::now();
  for (auto it = windows_.begin(); it != windows_.end();) {
    if (now - it->second.start <= kLogWindow) {
      ++it;
      continue;
    }
    if (it->second.suppressed > 0)
      BPS_LOG(kWarning) << it->second.suppressed << " more connection(s) from " << it->first
                        << " were refused in the last " << kLogWindow.count() << " s";
    it = windows_.erase(it);
  }
}

void WaitingRoom::Enter(std::unique_ptr<Connection> connection, const std::string& source,
                        int door) {
  if (!Admits(source)) {
    log_.Warn(source, "refusing a connection from " + connection->peer() +
                          ": others have not said who they are yet (at most " +
                          std::to_string(options_.max_per_source) + " may wait from " + source +
                          ", " + std::to_string(options_.max_waiting) + " in all)");
    return;  // Closes it.
  }
  Waiting waiting{std::move(connection), source, door, Clock::now(), {}, {}};
  Status status = ChallengeWorker(*waiting.connection, &waiting.challenge);
  if (!status.ok()) return Drop(waiting, status.message());
  waiting_.push_back(std::move(waiting));
}

void WaitingRoom::Watch(std::vector<pollfd>* fds) {
  first_watched_ = fds->size();
  watched_.clear();
  const auto now = Clock::now();
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i].quiet_until > now) continue;
    fds->push_back({waiting_[i].connection->fd(), POLLIN, 0});
    watched_.push_back(i);
  }
}

int WaitingRoom::MsUntilNextDeadline() const {
  auto wait = std::chrono::milliseconds(1000);
  const auto now = Clock::now();
  const auto until = [&](Clock::time_point then) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(then - now);
    wait = std::max(std::chrono::milliseconds(0),
                    std::min(wait, left + std::chrono::milliseconds(1)));
  };
  for (const Waiting& waiting : waiting_) {
    until(waiting.accepted_at + std::chrono::milliseconds(options_.deadline_ms));
    if (waiting.quiet_until > now) until(waiting.quiet_until);
  }
  return static_cast<int>(wait.count());
}

void WaitingRoom::Serve(const std::vector<pollfd>& fds, std::vector<Proven>* proven) {
  // Backwards: an introduction leaves the room, and the places before it stay.
  for (size_t i = watched_.size(); i-- > 0;)
    if (first_watched_ + i < fds.size() && fds[first_watched_ + i].revents)
      Introduce(watched_[i], proven);
  watched_.clear();
  DropOverdue();
  log_.Flush();
}

void WaitingRoom::Introduce(size_t index, std::vector<Proven>* proven) {
  const int arrived = waiting_[index].connection->BytesArrived();
  if (arrived > 0 && static_cast<size_t>(arrived) < kHelloFrameBytes &&
      HelloStillComing(*waiting_[index].connection, arrived)) {
    // Part of a hello: the rest may come before the deadline (a trickle never does).
    waiting_[index].quiet_until = Clock::now() + kPartialHelloQuiet;
    return;
  }
  Waiting waiting = std::move(waiting_[index]);
  waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(index));
  uint32_t rank = 0;
  Status status = WelcomeWorker(*waiting.connection, options_.secret, options_.num_workers,
                                waiting.challenge, &rank);
  if (!status.ok()) return Drop(waiting, status.message());
  proven->push_back(Proven{std::move(waiting.connection), rank, waiting.door});
}

void WaitingRoom::DropOverdue() {
  const auto now = Clock::now();
  const auto deadline = std::chrono::milliseconds(options_.deadline_ms);
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (now - it->accepted_at <= deadline) {
      ++it;
      continue;
    }
    const int ms = options_.deadline_ms;
    Drop(*it, "it did not introduce itself within " +
                  (ms % 1000 ? std::to_string(ms) + " ms" : std::to_string(ms / 1000) + " s"));
    it = waiting_.erase(it);
  }
}

void WaitingRoom::Drop(const Waiting& waiting, const std::string& why) {
  log_.Warn(waiting.source, "dropping connection from " + waiting.connection->peer() + ": " + why);
}

bool WaitingRoom::Named(const std::string& source) const {
  const auto& named = options_.named_sources;
  return std::find(named.begin(), named.end(), source) != named.end();
}

bool WaitingRoom::Admits(const std::string& source) {
  size_t from_source = 0;
  auto longest_stranger = waiting_.end();
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    from_source += it->source == source;
    if (!Named(it->source) &&
        (longest_stranger == waiting_.end() || it->accepted_at < longest_stranger->accepted_at))
      longest_stranger = it;
  }
  if (from_source >= options_.max_per_source) return false;
  if (waiting_.size() < options_.max_waiting) return true;
  if (longest_stranger == waiting_.end() || !Named(source)) return false;
  Drop(*longest_stranger, "the waiting room is full, and a worker's address (" + source +
                              ") comes before a stranger's");
  waiting_.erase(longest_stranger);
  return true;
}

}  // namespace bps
