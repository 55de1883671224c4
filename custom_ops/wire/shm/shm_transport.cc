// How the shared-memory transport connects and listens: a server's Unix socket in the
// abstract namespace, named after the job token and the server's TCP port
// (ServerSocketName), open only to processes of trusted uids (CheckLocalPeer).
#include <string>

#include "../../common/logging.h"
#include "shared_memory_channel.h"

namespace bps {
namespace {

class SharedMemory : public Transport {
 public:
  const char* name() const override { return "shm"; }
  bool required() const override { return false; }
  bool Reaches(const ServerAddress& address) const override { return address.same_host; }

  // Only a process of a trusted uid listening on the server's socket that proves the
  // token within the handshake's one deadline is taken for the server. Anything else
  // (no such socket, another uid, a refusal, garbage, silence) is not its word: the
  // worker takes the next transport, where the real server answers.
  Status Connect(const ConnectRequest& request, std::unique_ptr<Channel>* out) const override {
    const std::string& peer = request.peer;
    int fd = -1;
    Status status = ConnectLocal(ServerSocketName(request.secret.token, request.address.port),
                                 request.timeout_ms, &fd);
    if (!status.ok()) {  // None there (the server's host has no Unix socket for us) is no news.
      if (status.kind() != ErrorKind::kPeerGone)
        BPS_LOG(kWarning) << "the local socket of " << peer << " is not the server's ("
                          << status.message() << "); using TCP";
      return status;
    }
    auto connection = std::make_unique<Connection>(fd, peer);
    connection->set_generation(request.generation);
    status = ProveServer(*connection, request);
    if (status.kind() == ErrorKind::kAborted) return status;
    if (status.kind() == ErrorKind::kPeerGone) {  // Closed before its challenge: a full room.
      BPS_LOG(kDebug) << peer << " turned this worker away on its local socket ("
                      << status.message() << "); trying TCP";
      return status;
    }
    if (!status.ok()) {
      BPS_LOG(kWarning) << "the local socket of " << peer << " did not prove to be the server's ("
                        << status.message() << "); using TCP";
      return status;
    }
    BPS_LOG(kDebug) << peer << " is on this host: using its Unix socket and shared memory";
    std::shared_ptr<SharedSlots> slots = request.slots;
    if (!slots) slots = std::make_shared<SharedSlots>(std::make_shared<ArenaTable>());
    *out = std::make_unique<SharedMemoryChannel>(std::move(connection), std::move(slots),
                                                 SharedMemoryChannel::Side::kWorker);
    return Status::OK();
  }

  Status Listen(const std::string&, int* port, const std::string& token,
                int* fd) const override {
    Status status = ListenLocal(ServerSocketName(token, *port), fd);
    return status.ok() ? status : status.WithSuffix("; local workers will use TCP");
  }

  Status Admit(int fd, const sockaddr_storage&, std::string* peer,
               std::string* source) const override {
    Status trusted = CheckLocalPeer(fd);
    if (!trusted.ok())
      return Status::Error("refused a connection to the local socket: " + trusted.message());
    *peer = "a worker on this host";
    *source = "local";
    return Status::OK();
  }

  std::unique_ptr<Channel> ServerChannel(std::unique_ptr<Connection> connection,
                                         std::shared_ptr<SharedSlots> results) const override {
    return std::make_unique<SharedMemoryChannel>(std::move(connection), std::move(results),
                                                 SharedMemoryChannel::Side::kServer);
  }
};

}  // namespace

const Transport& SharedMemoryTransport() {
  static const SharedMemory transport;
  return transport;
}

}  // namespace bps
