// A Channel over a socket Connection (socket.h), what the socket transports (tcp/,
// shm/) have in common: frames go out under one lock, a transport's own control
// frames first, and come in as a header with its payload read from the socket.
#ifndef TF_BPS_WIRE_STREAM_CHANNEL_H_
#define TF_BPS_WIRE_STREAM_CHANNEL_H_

#include <memory>
#include <mutex>
#include <string>

#include "../common/common.h"
#include "crypto.h"
#include "protocol.h"
#include "socket.h"
#include "transport.h"

namespace bps {

class StreamChannel : public Channel {
 public:
  const std::string& peer() const override { return conn_->peer(); }
  Status Send(const FrameHeader& header, const void* payload) override;
  void RetireSlots(uint64_t /*tensor_id*/) override {}
  void ForgetPeerMemory() override {}
  bool shares_memory() const override { return false; }
  void SetReceiveTimeout(int ms) override { conn_->SetReceiveTimeout(ms); }
  void SetSendTimeout(int ms) override { conn_->SetSendTimeout(ms); }
  void Shutdown() override { conn_->Shutdown(); }
  void ShutdownWrite() override { conn_->ShutdownWrite(); }
  // Seals every frame from now on (see Connection::Seal). The handshake seals the
  // bare connection (auth.h); this is for a channel made of an unsealed one.
  void Seal(std::unique_ptr<RecordCipher> sealer, std::unique_ptr<RecordCipher> opener) {
    std::lock_guard<std::mutex> lock(write_mutex_);
    conn_->Seal(std::move(sealer), std::move(opener));
  }

 protected:
  explicit StreamChannel(std::unique_ptr<Connection> conn) : conn_(std::move(conn)) {}
  // Reads a header and hands the payload to a stream reader.
  Status ReceiveFromSocket(FrameHeader* header, DataReader* payload, bool* eof);
  // Control frames a transport sends before the caller's (write_mutex_ held).
  virtual void SendControlLocked() {}

  const std::unique_ptr<Connection> conn_;
  std::mutex write_mutex_;
};

}  // namespace bps

#endif  // TF_BPS_WIRE_STREAM_CHANNEL_H_
