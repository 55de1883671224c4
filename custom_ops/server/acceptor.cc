// A server's door: the acceptor thread takes connections and keeps those that have
// not yet proven the job token in a waiting room that costs no thread
// (wire/waiting_room.h), polled with the listeners. A worker that proves it gets a
// channel and a reader thread (server.cc).
#include <poll.h>

#include <cerrno>

#include "../common/logging.h"
#include "server.h"

namespace bps {

void Server::AcceptLoop() {
  const std::vector<int> listening = listener_.fds();
  std::vector<pollfd> watched;
  std::vector<WaitingRoom::Proven> proven;
  while (!stopping_) {
    watched.clear();
    for (int fd : listening) watched.push_back({fd, POLLIN, 0});
    room_->Watch(&watched);
    if (::poll(watched.data(), watched.size(), room_->MsUntilNextDeadline()) < 0 &&
        errno != EINTR)
      break;
    room_->Serve(watched, &proven);
    for (WaitingRoom::Proven& worker : proven) Welcome(std::move(worker));
    proven.clear();
    {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      ReapReaders();
    }
    bool knocked = false;
    for (size_t i = 0; i < listening.size(); ++i) knocked |= watched[i].revents != 0;
    if (knocked && !AcceptNewcomers()) break;  // Stop() closed the listener.
  }
  room_->Clear();  // Closes them.
}

bool Server::AcceptNewcomers() {
  // A bounded batch per wake-up: a flood of connections must not starve the
  // introductions of those already waiting.
  for (int batch = 0; batch < 256; ++batch) {
    std::unique_ptr<Connection> connection;
    std::string source;
    int door = 0;
    Status status = listener_.Accept(&connection, &source, &door, 0);
    if (status.kind() == ErrorKind::kTimeout) return true;
    if (!status.ok()) return false;
    room_->Enter(std::move(connection), source, door);
  }
  return true;
}

void Server::Welcome(WaitingRoom::Proven proven) {
  const uint32_t rank = proven.rank;
  auto conn = std::make_shared<WorkerConn>(
      listener_.ChannelOf(std::move(proven.connection), proven.door));
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

}  // namespace bps
