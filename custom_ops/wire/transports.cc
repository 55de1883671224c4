// The registered transports, in the order a worker tries them: a new transport is a
// folder under wire/ and a line here (and its sources in native_sources.bzl).
#include "shm/shared_memory_channel.h"
#include "tcp/tcp_transport.h"
#include "transport.h"

namespace bps {

const std::vector<const Transport*>& RegisteredTransports() {
  static const std::vector<const Transport*> transports = {
      &SharedMemoryTransport(),
      &TcpTransport(),
  };
  return transports;
}

}  // namespace bps
