// Connections that have not yet proven the job token: a server's, and a local merge's
// (the workers of one host). They cost no thread: whoever owns the room polls their
// descriptors with its own and hands the room what turned readable. The room is
// bounded in all and per source address, and every connection has one deadline,
// counted from its accept, for everything before its proof however slowly it
// trickles; until then it is sent only its challenge and read only when a whole hello
// of the exact size has arrived (auth.h). Not thread-safe: one thread owns a room.
#ifndef TF_BPS_WIRE_WAITING_ROOM_H_
#define TF_BPS_WIRE_WAITING_ROOM_H_

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../common/common.h"
#include "crypto.h"
#include "socket.h"

namespace bps {

// Logs at most a few lines per source and window: a stranger repeating itself gets
// one line now and a count later, not a line each time.
class RateLimitedLog {
 public:
  // Logs `text` (a warning) unless `source` has had its share of this window.
  void Warn(const std::string& source, const std::string& text);
  // Ends the windows that are over, saying how many lines each held back.
  void Flush();

 private:
  struct Window {
    std::chrono::steady_clock::time_point start;
    int logged = 0;
    int suppressed = 0;
  };
  std::unordered_map<std::string, Window> windows_;
};

class WaitingRoom {
 public:
  struct Options {
    JobSecret secret{""};
    int num_workers = 1;   // ranks 0 .. num_workers - 1 may introduce themselves
    int deadline_ms = 10000;
    size_t max_waiting = 64;
    size_t max_per_source = 16;
    // Addresses of the job's workers ("local": this host's Unix socket): when the room
    // is full, a connection from one of them displaces the longest-waiting stranger.
    std::vector<std::string> named_sources;
  };
  // A connection that proved the token, as worker `rank`.
  struct Proven {
    std::unique_ptr<Connection> connection;
    uint32_t rank = 0;
    int door = 0;  // as it entered
  };

  explicit WaitingRoom(Options options) : options_(std::move(options)) {}

  // A connection just accepted (from `source`, "local" for this host's): challenged
  // and kept waiting, or closed when its source or the room is full. `door`: which of
  // the owner's listeners it came by (Listener::Accept), handed back with its proof.
  void Enter(std::unique_ptr<Connection> connection, const std::string& source, int door);
  // Appends the descriptors worth polling now to `fds`; Serve() reads their revents.
  void Watch(std::vector<pollfd>* fds);
  // How long the owner's poll may wait before a deadline needs looking at (<= 1 s).
  int MsUntilNextDeadline() const;
  // After the poll over Watch()'s descriptors: the connections that proved the token
  // go to `proven`; those that failed or are overdue are closed.
  void Serve(const std::vector<pollfd>& fds, std::vector<Proven>* proven);
  size_t size() const { return waiting_.size(); }
  void Clear() { waiting_.clear(); }

 private:
  struct Waiting {
    std::unique_ptr<Connection> connection;
    std::string source;
    int door = 0;
    std::chrono::steady_clock::time_point accepted_at;
    Nonce challenge{};
    // Part of its hello came: it stays readable, so it is looked at again only then
    // (polling it meanwhile would spin).
    std::chrono::steady_clock::time_point quiet_until{};
  };

  bool Admits(const std::string& source);
  bool Named(const std::string& source) const;
  // Waiting connection `index` turned readable: once its whole hello is there (or it
  // closed), it proves the token or is dropped.
  void Introduce(size_t index, std::vector<Proven>* proven);
  void DropOverdue();
  void Drop(const Waiting& waiting, const std::string& why);

  const Options options_;
  std::vector<Waiting> waiting_;
  size_t first_watched_ = 0;          // where Watch() put the first of ours in `fds`
  std::vector<size_t> watched_;        // indices into waiting_, in Watch() order
  RateLimitedLog log_;
};

}  // namespace bps

#endif  // TF_BPS_WIRE_WAITING_ROOM_H_
