// The TCP transport: every byte of every frame on a TCP socket. It is the one every
// server listens on first (its port is the one the address book names) and the one a
// worker falls back on.
#ifndef TF_BPS_WIRE_TCP_TCP_TRANSPORT_H_
#define TF_BPS_WIRE_TCP_TCP_TRANSPORT_H_

#include <memory>

#include "../stream_channel.h"
#include "../transport.h"

namespace bps {

class SocketChannel : public StreamChannel {
 public:
  explicit SocketChannel(std::unique_ptr<Connection> conn) : StreamChannel(std::move(conn)) {}
  Status SendData(FrameHeader header, const void* data, const SlotKey&) override {
    return Send(header, data);
  }
  Status Receive(FrameHeader* header, DataReader* payload, bool* eof) override {
    return ReceiveFromSocket(header, payload, eof);
  }
};

const Transport& TcpTransport();

}  // namespace bps

#endif  // TF_BPS_WIRE_TCP_TCP_TRANSPORT_H_
