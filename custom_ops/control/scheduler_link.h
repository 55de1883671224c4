// A node's side of the control plane, in C++ for the native server: the same
// exchange as tf_bps/runtime/rendezvous.py's SchedulerLink (hello; the scheduler's
// challenge; the registration with our nonce and proof over both; the scheduler's
// proof, "registered"; the address book; then heartbeats until the scheduler says
// exit or abort). No tensor data travels here.
#ifndef TF_BPS_CONTROL_SCHEDULER_LINK_H_
#define TF_BPS_CONTROL_SCHEDULER_LINK_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../common/common.h"
#include "../wire/crypto.h"
#include "json.h"
#include "zmq_dealer.h"

namespace bps {

struct SchedulerLinkOptions {
  std::string host;        // DMLC_PS_ROOT_URI
  int port = 0;            // DMLC_PS_ROOT_PORT
  std::string token;       // BYTEPS_JOB_TOKEN
  bool encrypt = false;    // BYTEPS_ENCRYPT: messages after the proofs are sealed
  double timeout_s = 300;  // for the connection and the first address book
  std::string timeout_variable = "BYTEPS_OP_TIMEOUT";  // or HOROVOD_START_TIMEOUT
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 10;
  // BYTEPS_ELASTIC_TIMEOUT: how long a registration after the first (the job
  // re-forming) may wait for its address book.
  double reform_timeout_s = 600;
  // For the timeout's message: the job's size.
  int num_workers = 1;
  int num_servers = 1;
};

class SchedulerLink {
 public:
  static Status Connect(const SchedulerLinkOptions& options, std::unique_ptr<SchedulerLink>* out);

  // Proves the job token both ways (this node first), registers this node (`fields`
  // add to role, pid, host and proof) and returns the scheduler's address book. Called
  // again when the job re-forms (a "reform" order), for the next generation's book.
  Status Register(const std::string& role, const std::string& host, JsonWriter fields, Json* book);
  // Sends a heartbeat when one is due, then waits until the next is due for the
  // scheduler's orders (exit, abort, reform; other messages are dropped) or for
  // `extra_fd` to turn readable (-1: none). Fails once the scheduler has been silent
  // for longer than the heartbeat timeout.
  Status PollOnce(int extra_fd, std::vector<Json>* orders, bool* extra_ready);
  // Sealed once registered, with BYTEPS_ENCRYPT.
  Status Send(const std::string& message);

 private:
  using Clock = std::chrono::steady_clock;
  SchedulerLink(const SchedulerLinkOptions& options, std::unique_ptr<ZmqDealer> dealer,
                Clock::time_point started);
  // The scheduler's next message of `type`; an abort or the deadline fails.
  Status NextReply(Clock::time_point deadline, double timeout_s, const std::string& type,
                   Json* reply);
  // Sends the registration answering `challenge`, with `mine` (this node's nonce)
  // and the proof over both; with BYTEPS_ENCRYPT under new keys of its own.
  // The scheduler's challenge, saying hello (again every kHelloAgain, and on a new
  // connection if the scheduler cut ours: one full of strangers' connections cuts new
  // ones before it reads them) until `deadline`.
  Status AwaitChallenge(Clock::time_point deadline, double timeout_s, Json* challenge);
  Status SendRegistration(const std::string& role, const std::string& host, JsonWriter fields,
                          const Json& challenge, const std::string& mine);
  // The error an abort that answers this node's registration makes.
  Status Refusal(const Json& abort) const;
  // Takes the scheduler's orders that have arrived, a bounded number at a time.
  Status Drain(std::vector<Json>* orders);
  // The message `text` holds (opened, when sealed); false for one to drop: not JSON,
  // or with BYTEPS_ENCRYPT one that does not open (only the challenge and a refusal
  // come in the clear, while registering).
  bool Decode(const std::string& text, Json* message);

  static constexpr int kMaxMessagesPerPoll = 64;
  static constexpr std::chrono::seconds kHelloAgain{3};

  SchedulerLinkOptions options_;
  std::unique_ptr<ZmqDealer> dealer_;
  std::string endpoint_;
  Clock::time_point started_;  // the first connection attempt
  bool registered_ = false;    // once: later registrations re-form the job
  Clock::time_point last_heard_;
  Clock::time_point next_heartbeat_;
  // BYTEPS_ENCRYPT (tf_bps/runtime/sealing.py tells the envelope): the keys of the
  // last registration, and the sequence numbers sent and opened under them.
  bool sealed_ = false;
  // While registering, what it waits for: what may come in the clear, and whether an
  // abort is believed.
  enum class Stage { kNone, kChallenge, kRegistered, kBook };
  Stage stage_ = Stage::kNone;
  std::string said_;  // the registration's nonces, "challenge|node nonce"
  ControlKeys keys_{};
  uint64_t sent_ = 0;
  uint64_t opened_ = 0;
};

// What `side` ("node" or "scheduler") shows for `nonce` ("challenge|node nonce", and
// what a refusal says): the hex HMAC-SHA256 of "side|nonce" under the job token
// (rendezvous.py's proof()).
std::string ControlProof(const std::string& token, const std::string& side,
                         const std::string& nonce);

}  // namespace bps

#endif  // TF_BPS_CONTROL_SCHEDULER_LINK_H_
