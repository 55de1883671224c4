// One partition key's rounds, kept alike by a server and by a host's local merge:
// which round is in progress, who is in it, whose contribution is still missing, and
// why the last one ended. Rounds of one key never mix: a contribution for a round
// that ended is refused with the reason it ended, one for another round than the one
// in progress ends both (the workers are out of step), and a round ends for everyone
// when a member gives it up, shuts down, or sends something that does not match.
//
// What a round holds (sums, rows) and how it answers a success belong to its owner;
// a Round only decides, and reports errors through RoundAnswers. Members are worker
// ranks. Not thread-safe: each key belongs to one thread (or one lock) of its owner.
#ifndef TF_BPS_ROUNDS_ROUND_H_
#define TF_BPS_ROUNDS_ROUND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "../common/common.h"

namespace bps {

// Where a round reports: the server answers over worker connections, a local merge
// queues frames to its host's peers (or fails its own worker's operation).
class RoundAnswers {
 public:
  virtual ~RoundAnswers() = default;
  // Tells worker `rank` that its contribution to `round` ended with an error.
  virtual void Error(uint32_t rank, uint32_t round, ErrorKind kind, const std::string& message) = 0;
  // The tensor as messages name it, from `rank`'s declaration: "'name'" or "with id N".
  virtual std::string Tensor(uint32_t rank) = 0;
  // Why workers `a` and `b` cannot take part in one round of the tensor.
  virtual std::string Mismatch(uint32_t a, uint32_t b) = 0;
  // The round in progress has ended: let go of what it holds.
  virtual void Release() = 0;
};

// Who is still there: a member that joined (bps.join) takes part with nothing; one
// that shut down can never complete a round it has not contributed to.
class Roster {
 public:
  virtual ~Roster() = default;
  // Whether `rank` joined in join epoch `epoch` (a server knows one epoch: 0).
  virtual bool Joined(uint32_t rank, uint16_t epoch) const = 0;
  virtual bool Gone(uint32_t rank) const = 0;
};

// One contribution as it reaches a key.
struct Arrival {
  uint32_t rank = 0;   // who sent it
  uint32_t round = 0;  // the sender's count of operations on the tensor
  uint16_t epoch = 0;  // joins the sender has seen complete (local merge only)
};

class Round {
 public:
  enum class Admission {
    kOpens,    // no round is in progress: the arrival opens its own (Open)
    kJoins,    // it belongs to the round in progress
    kRefused,  // already answered with an error (stale, or out of step)
  };
  enum class Progress { kWaiting, kComplete, kFailed };

  Admission Admit(const Arrival& arrival, RoundAnswers* answers);
  // Opens the arrival's round for `members` (ascending ranks).
  void Open(const Arrival& first, std::vector<uint32_t> members);
  // Takes the arrival's contribution, counted for each of `counts_for` (the sender,
  // or every worker of a host whose leader merged them). False, with the round
  // failed, if one of them is in already: partition `part` arrived twice.
  bool Add(const Arrival& arrival, const std::vector<uint32_t>& counts_for, uint32_t part,
           RoundAnswers* answers);
  // Whether every member is in or excused; fails the round when a missing member
  // has shut down.
  Progress Check(const Roster& roster, RoundAnswers* answers);
  // Ends the round in progress with an error for each contributor and for the
  // `refused` arrival (which hears it for its own round).
  void Fail(ErrorKind kind, const std::string& message, RoundAnswers* answers,
            const Arrival* refused = nullptr);
  // Ends the round in progress: it succeeded.
  void Succeed(RoundAnswers* answers);
  // Worker `arrival.rank` gave up `arrival.round` (its operation failed or timed
  // out): that round ends for everyone, or, if it has not begun here, is refused to
  // whoever contributes to it later.
  void GiveUp(const Arrival& arrival, RoundAnswers* answers);
  // Worker `rank` shut down: a round it contributed to, still open, ends.
  void Forget(uint32_t rank, RoundAnswers* answers);

  bool active() const { return active_; }
  uint32_t round() const { return round_; }
  uint16_t epoch() const { return epoch_; }
  // The latest round that ended (or was given up before it began).
  uint32_t last_closed() const { return last_closed_; }
  const std::vector<uint32_t>& members() const { return members_; }
  // Who contributed, in arrival order: they receive the result.
  const std::vector<uint32_t>& contributors() const { return contributors_; }
  // Whether `rank`'s data is in (its own push, or its host's merged one).
  bool Covers(uint32_t rank) const;
  bool IsMember(uint32_t rank) const;

 private:
  // Remembers why the round in progress ended, and forgets who was in it.
  void Close(ErrorKind kind, const std::string& message, RoundAnswers* answers);

  bool active_ = false;
  uint32_t round_ = 0;  // in progress, while active
  uint16_t epoch_ = 0;
  uint32_t last_closed_ = 0;  // rounds up to this one are over: their contributions are stale
  std::string closed_error_;  // why `last_closed_` failed; empty if it completed
  ErrorKind closed_kind_ = ErrorKind::kOk;
  std::vector<uint32_t> members_;
  std::vector<uint32_t> contributors_;
  std::vector<uint32_t> covered_;  // contributors and the workers their pushes merged
};

}  // namespace bps

#endif  // TF_BPS_ROUNDS_ROUND_H_
