#include "tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

namespace bps {
namespace {

class Tcp : public Transport {
 public:
  const char* name() const override { return "tcp"; }
  bool required() const override { return true; }
  bool Reaches(const ServerAddress&) const override { return true; }

  Status Connect(const ConnectRequest& request, std::unique_ptr<Channel>* out) const override {
    int fd = -1;
    Status status = ConnectTcp(request.address.host, request.address.port, request.timeout_ms,
                               request.timeout_ms, &fd, request.cancel);
    if (!status.ok()) return status;
    auto connection = std::make_unique<Connection>(fd, request.peer);
    connection->set_generation(request.generation);
    status = ProveServer(*connection, request);
    if (!status.ok()) return status;
    *out = std::make_unique<SocketChannel>(std::move(connection));
    return Status::OK();
  }

  Status Listen(const std::string& host, int* port, const std::string&, int* fd) const override {
    return ListenTcp(host, *port, fd, port);
  }

  // The peer is named by its address and port; its waiting-room share is its address's.
  Status Admit(int, const sockaddr_storage& address, std::string* peer,
               std::string* source) const override {
    *peer = "a worker";
    if (address.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
      char host[INET_ADDRSTRLEN] = {0};
      ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
      *peer = std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
    }
    *source = peer->substr(0, peer->rfind(':'));
    return Status::OK();
  }

  std::unique_ptr<Channel> ServerChannel(std::unique_ptr<Connection> connection,
                                         std::shared_ptr<SharedSlots>) const override {
    return std::make_unique<SocketChannel>(std::move(connection));
  }
};

}  // namespace

const Transport& TcpTransport() {
  static const Tcp transport;
  return transport;
}

}  // namespace bps
