#include "scheduler_link.h"

#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "../common/logging.h"
#include "../wire/auth.h"
#include "settings.h"

namespace bps {
namespace {

std::string Hex(const uint8_t* bytes, size_t count) {
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (size_t i = 0; i < count; ++i) {
    hex += kDigits[bytes[i] >> 4];
    hex += kDigits[bytes[i] & 15];
  }
  return hex;
}

// The bytes `hex` spells; false if it is not hex.
bool FromHex(const std::string& hex, std::string* bytes) {
  if (hex.size() % 2) return false;
  bytes->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    int value = 0;
    for (char digit : {hex[i], hex[i + 1]}) {
      const int nibble = isdigit(static_cast<unsigned char>(digit)) ? digit - '0'
                         : digit >= 'a' && digit <= 'f'             ? digit - 'a' + 10
                                                                    : -1;
      if (nibble < 0) return false;
      value = value * 16 + nibble;
    }
    bytes->push_back(static_cast<char>(value));
  }
  return true;
}

// Compares in time that does not depend on where the texts differ.
bool SameText(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  return differ == 0;
}

Status NewNonce(std::string* nonce) {
  uint8_t bytes[16];
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes)))
    return Status::Error("getrandom failed");
  *nonce = Hex(bytes, sizeof(bytes));
  return Status::OK();
}

int MillisecondsUntil(std::chrono::steady_clock::time_point when) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      when - std::chrono::steady_clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

std::chrono::steady_clock::duration Seconds(double seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds));
}

}  // namespace

std::string ControlProof(const std::string& token, const std::string& side,
                         const std::string& nonce) {
  std::string text = side + "|" + nonce;
  Digest digest = HmacSha256(token, text.data(), text.size());
  return Hex(digest.data(), digest.size());
}

SchedulerLink::SchedulerLink(const SchedulerLinkOptions& options, std::unique_ptr<ZmqDealer> dealer,
                             Clock::time_point started)
    : options_(options),
      dealer_(std::move(dealer)),
      endpoint_("tcp://" + options.host + ":" + std::to_string(options.port)),
      started_(started),
      last_heard_(Clock::now()),
      next_heartbeat_(Clock::now()) {}

Status SchedulerLink::Connect(const SchedulerLinkOptions& options,
                              std::unique_ptr<SchedulerLink>* out) {
  const Clock::time_point started = Clock::now();
  std::unique_ptr<ZmqDealer> dealer;
  Status status = ZmqDealer::Connect(options.host, options.port,
                                     static_cast<int>(options.timeout_s * 1000), &dealer);
  if (!status.ok())
    return Status::Error(status.kind(), status.message() + " (is the scheduler running? see " +
                                            options.timeout_variable + ")");
  out->reset(new SchedulerLink(options, std::move(dealer), started));
  return Status::OK();
}

Status SchedulerLink::NextReply(Clock::time_point deadline, double timeout_s,
                                const std::string& type, Json* reply) {
  while (true) {  // Until the deadline, however much else arrives.
    std::string text;
    bool received = false;
    Status status = dealer_->Receive(MillisecondsUntil(deadline), &text, &received);
    if (!status.ok()) return status;
    if (!received || Clock::now() >= deadline)
      return Status::Error(
          ErrorKind::kTimeout,
          "no " + std::string(type == "book" ? "address book" : "answer") +
              " from the scheduler at " + endpoint_ + " within " + FormatG(timeout_s) +
              (registered_
                   ? " s of the job re-forming (BYTEPS_ELASTIC_TIMEOUT)"
                   : " s (is it running, and have all " + std::to_string(options_.num_workers) +
                         " worker(s) and " + std::to_string(options_.num_servers) +
                         " server(s) started? see " + options_.timeout_variable + ")"));
    if (!Decode(text, reply)) continue;  // Not one of its messages.
    const std::string& kind = (*reply)["type"].str();
    if (kind == type) return Status::OK();
    if (kind == "abort" && (stage_ == Stage::kRegistered || stage_ == Stage::kBook))
      return Refusal(*reply);
  }
}

Status SchedulerLink::Refusal(const Json& abort) const {
  const std::string& reason = abort["reason"].str();
  // After the scheduler's proof, or with a proof of its own, a refusal says why.
  const std::string proof = ControlProof(options_.token, "scheduler", said_ + "|" + reason);
  if (stage_ == Stage::kBook || SameText(abort["proof"].str(), proof))
    return Status::Error(ErrorKind::kAborted, "the scheduler refused this node: " + reason);
  return Status::Error(ErrorKind::kAborted,
                       "the scheduler at " + endpoint_ +
                           " refused this node before it proved the job's token: check that "
                           "BYTEPS_JOB_TOKEN and BYTEPS_ENCRYPT are the job's (the scheduler's "
                           "log says why)");
}

Status SchedulerLink::AwaitChallenge(Clock::time_point deadline, double timeout_s,
                                     Json* challenge) {
  while (true) {
    Status status = dealer_->Send(JsonWriter().Add("type", "hello").Finish());
    if (status.ok())
      status = NextReply(std::min(deadline, Clock::now() + kHelloAgain), timeout_s, "challenge",
                         challenge);
    if (status.ok() || Clock::now() >= deadline) return status;
    if (status.kind() == ErrorKind::kTimeout) continue;
    // Only a connection the scheduler closed is worth another: anything else it said
    // is no scheduler's word.
    if (status.kind() != ErrorKind::kPeerGone) return status;
    std::unique_ptr<ZmqDealer> again;
    if (!ZmqDealer::Connect(options_.host, options_.port, MillisecondsUntil(deadline), &again).ok())
      return status;
    dealer_ = std::move(again);
  }
}

Status SchedulerLink::Register(const std::string& role, const std::string& host, JsonWriter fields,
                               Json* book) {
  // The first: one start timeout from the first connection attempt, as on the
  // Python side; a re-forming: one BYTEPS_ELASTIC_TIMEOUT from now.
  const double timeout_s = registered_ ? options_.reform_timeout_s : options_.timeout_s;
  const Clock::time_point deadline = (registered_ ? Clock::now() : started_) + Seconds(timeout_s);
  std::string mine;
  Status status = NewNonce(&mine);
  stage_ = Stage::kChallenge;
  // In the clear: the scheduler has no keys for this registration yet. The last
  // registration's keys stay until this one's replace them.
  Json challenge;
  if (status.ok()) status = AwaitChallenge(deadline, timeout_s, &challenge);
  if (status.ok()) status = SendRegistration(role, host, std::move(fields), challenge, mine);
  Json registered;
  if (status.ok()) status = NextReply(deadline, timeout_s, "registered", &registered);
  if (status.ok() &&
      !SameText(registered["proof"].str(), ControlProof(options_.token, "scheduler", said_)))
    status = Status::Error(ErrorKind::kPeerGone,
                           "the scheduler at " + endpoint_ +
                               " does not know this job's token (BYTEPS_JOB_TOKEN): it is not "
                               "this job's scheduler");
  stage_ = Stage::kBook;
  if (status.ok()) status = NextReply(deadline, timeout_s, "book", book);
  stage_ = Stage::kNone;
  last_heard_ = Clock::now();
  if (status.ok()) registered_ = true;
  return status;
}

Status SchedulerLink::SendRegistration(const std::string& role, const std::string& host,
                                       JsonWriter fields, const Json& challenge,
                                       const std::string& mine) {
  // The challenge goes back with the proof: the scheduler keeps none.
  const std::string nonce = challenge["nonce"].str().substr(0, 128);
  said_ = nonce + "|" + mine;
  fields.Add("type", "register")
      .Add("role", role)
      .Add("pid", static_cast<int64_t>(getpid()))
      .Add("host", host);
  JsonWriter registration;
  if (options_.encrypt) {
    // The fields go sealed as message 1 under this registration's own keys: the
    // scheduler derives them from the clear nonces once the proof checks.
    ControlKeys keys;
    Status status = DeriveControlKeys(options_.token, nonce, mine, &keys);
    std::string box;
    if (status.ok()) status = SealMessage(keys.node_to_scheduler, 1, fields.Finish(), &box);
    if (!status.ok()) return status;
    keys_ = keys;
    sent_ = 1;
    opened_ = 0;
    sealed_ = true;
    registration.Add("type", "register")
        .Add("seq", int64_t{1})
        .Add("box", Hex(reinterpret_cast<const uint8_t*>(box.data()), box.size()));
  } else {
    registration = fields;
  }
  registration.Add("nonce", nonce)
      .Add("node_nonce", mine)
      .Add("proof", ControlProof(options_.token, "node", said_));
  stage_ = Stage::kRegistered;
  return dealer_->Send(registration.Finish());
}

Status SchedulerLink::Send(const std::string& message) {
  if (!sealed_) return dealer_->Send(message);
  std::string box;
  Status status = SealMessage(keys_.node_to_scheduler, ++sent_, message, &box);
  if (!status.ok()) return status;
  return dealer_->Send(
      JsonWriter()
          .Add("type", "sealed")
          .Add("seq", static_cast<int64_t>(sent_))
          .Add("box", Hex(reinterpret_cast<const uint8_t*>(box.data()), box.size()))
          .Finish());
}

bool SchedulerLink::Decode(const std::string& text, Json* message) {
  if (!Json::Parse(text, message).ok() || (*message)["type"].str().empty()) return false;
  const std::string& type = (*message)["type"].str();
  if (!options_.encrypt) return true;
  // In the clear come only the challenge and a refusal of the registration (Refusal()
  // believes it only with the scheduler's proof).
  if ((type == "challenge" && stage_ == Stage::kChallenge) ||
      (type == "abort" && stage_ == Stage::kRegistered))
    return true;
  if (type != "sealed" || !sealed_) return false;
  int64_t sequence = 0;
  std::string box, clear;
  const bool opened =
      (*message)["seq"].AsInt(static_cast<int64_t>(opened_) + 1, INT64_MAX, &sequence) &&
      FromHex((*message)["box"].str(), &box) &&
      OpenMessage(keys_.scheduler_to_node, static_cast<uint64_t>(sequence), box, &clear) &&
      Json::Parse(clear, message).ok() && !(*message)["type"].str().empty();
  if (!opened) {
    // While registering, messages under the last registration's keys are due.
    if (stage_ == Stage::kNone)
      BPS_LOG(kWarning) << "dropped a message from the scheduler at " << endpoint_
                        << " that does not authenticate (BYTEPS_ENCRYPT)";
    return false;
  }
  opened_ = static_cast<uint64_t>(sequence);
  return true;
}

Status SchedulerLink::Drain(std::vector<Json>* orders) {
  // Bounded, so that a flood of messages cannot starve the heartbeats.
  for (int i = 0; i < kMaxMessagesPerPoll; ++i) {
    std::string text;
    bool received = false;
    Status status = dealer_->Receive(0, &text, &received);
    if (!status.ok() || !received) return status;
    Json message;
    if (!Decode(text, &message)) continue;  // Garbage is not the scheduler speaking.
    last_heard_ = Clock::now();
    const std::string& type = message["type"].str();
    if (type == "exit" || type == "abort" || type == "reform")
      orders->push_back(std::move(message));
  }
  return Status::OK();
}

Status SchedulerLink::PollOnce(int extra_fd, std::vector<Json>* orders, bool* extra_ready) {
  *extra_ready = false;
  Status sent = Status::OK();
  if (Clock::now() >= next_heartbeat_) {
    sent = Send(JsonWriter().Add("type", "heartbeat").Finish());
    next_heartbeat_ = Clock::now() + Seconds(options_.heartbeat_interval_s);
  }
  Status drained = Drain(orders);  // What is buffered first: poll() cannot see it.
  if (orders->empty() && sent.ok() && drained.ok()) {
    pollfd fds[2] = {{dealer_->fd(), POLLIN, 0}, {extra_fd, POLLIN, 0}};
    int polled = poll(fds, extra_fd >= 0 ? 2 : 1, MillisecondsUntil(next_heartbeat_));
    if (polled > 0 && extra_fd >= 0 && (fds[1].revents & (POLLIN | POLLHUP))) *extra_ready = true;
    drained = Drain(orders);
  }
  // The scheduler's last words (an exit, say) often come with its close: they count
  // first, and the next poll reports the failure.
  if (!orders->empty()) return Status::OK();
  if (!sent.ok()) return sent;
  if (!drained.ok()) return drained;
  double silent = std::chrono::duration<double>(Clock::now() - last_heard_).count();
  if (silent > options_.heartbeat_timeout_s) {
    char seconds[32];
    snprintf(seconds, sizeof(seconds), "%.0f", silent);
    return Status::Error(ErrorKind::kPeerGone,
                         "the scheduler at " + endpoint_ + " has not answered for " + seconds +
                             " s (PS_HEARTBEAT_TIMEOUT); it has probably died");
  }
  return Status::OK();
}

}  // namespace bps
