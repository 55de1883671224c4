#include "stream_channel.h"

namespace bps {

Status StreamChannel::Send(const FrameHeader& header, const void* payload) {
  std::lock_guard<std::mutex> lock(write_mutex_);
  SendControlLocked();
  return conn_->Send(header, payload);
}

Status StreamChannel::ReceiveFromSocket(FrameHeader* header, DataReader* payload, bool* eof) {
  Status status = conn_->ReceiveHeader(header, eof);
  *payload = DataReader::OfStream(conn_.get(), status.ok() ? header->length : 0);
  return status;
}

}  // namespace bps
