#include "round.h"

#include <algorithm>

namespace bps {
namespace {

bool Contains(const std::vector<uint32_t>& ranks, uint32_t rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

std::string WorkerRank(uint32_t rank) { return "worker rank " + std::to_string(rank); }

}  // namespace

Round::Admission Round::Admit(const Arrival& arrival, RoundAnswers* answers) {
  const std::string round_text = "round " + std::to_string(arrival.round);
  if (arrival.round <= last_closed_) {
    if (arrival.round == last_closed_ && !closed_error_.empty()) {
      // A late contributor to a round that failed hears the same reason as the others.
      answers->Error(arrival.rank, arrival.round, closed_kind_, closed_error_);
    } else {
      answers->Error(arrival.rank, arrival.round, ErrorKind::kAborted,
                     WorkerRank(arrival.rank) + " sent " + round_text + " of tensor " +
                         answers->Tensor(arrival.rank) + " after round " +
                         std::to_string(last_closed_) + " had ended" +
                         (closed_error_.empty() ? "" : " (" + closed_error_ + ")") +
                         "; it is refused so that no stale value reaches another round");
    }
    return Admission::kRefused;
  }
  if (!active_) return Admission::kOpens;
  if (arrival.round == round_ && arrival.epoch == epoch_) return Admission::kJoins;
  const uint32_t newest = std::max(arrival.round, round_);
  Fail(ErrorKind::kAborted,
       "workers are out of step on tensor " + answers->Tensor(arrival.rank) + ": " +
           WorkerRank(contributors_.front()) + " sent round " + std::to_string(round_) + ", " +
           WorkerRank(arrival.rank) + " sent " + round_text +
           (arrival.epoch != epoch_ ? " on the other side of a join" : "") +
           " (an earlier operation on it failed on some worker)",
       answers, &arrival);
  last_closed_ = newest;
  return Admission::kRefused;
}

void Round::Open(const Arrival& first, std::vector<uint32_t> members) {
  active_ = true;
  round_ = first.round;
  epoch_ = first.epoch;
  members_ = std::move(members);
  contributors_.clear();
  covered_.clear();
}

bool Round::Add(const Arrival& arrival, const std::vector<uint32_t>& counts_for, uint32_t part,
                RoundAnswers* answers) {
  for (uint32_t r : counts_for) {
    if (!Covers(r)) continue;
    Fail(ErrorKind::kInternal,
         "partition " + std::to_string(part) + " of tensor " + answers->Tensor(arrival.rank) +
             " arrived twice for " + WorkerRank(r) + " in round " + std::to_string(round_) +
             " (the last from " + WorkerRank(arrival.rank) + ")",
         answers, &arrival);
    return false;
  }
  contributors_.push_back(arrival.rank);
  covered_.insert(covered_.end(), counts_for.begin(), counts_for.end());
  return true;
}

Round::Progress Round::Check(const Roster& roster, RoundAnswers* answers) {
  bool waiting = false;
  for (uint32_t r : members_) {
    if (Covers(r) || roster.Joined(r, epoch_)) continue;  // Joined: takes part with nothing.
    if (roster.Gone(r)) {
      Fail(ErrorKind::kPeerGone,
           WorkerRank(r) + " has already shut down, so tensor " +
               answers->Tensor(contributors_.empty() ? r : contributors_.front()) +
               " cannot complete",
           answers);
      return Progress::kFailed;
    }
    waiting = true;
  }
  return waiting ? Progress::kWaiting : Progress::kComplete;
}

void Round::Fail(ErrorKind kind, const std::string& message, RoundAnswers* answers,
                 const Arrival* refused) {
  for (uint32_t r : contributors_) answers->Error(r, round_, kind, message);
  // Every contribution gets one answer: a refused one hears it for its own round.
  if (refused && !(refused->round == round_ && Contains(contributors_, refused->rank)))
    answers->Error(refused->rank, refused->round, kind, message);
  Close(kind, message, answers);
}

void Round::Succeed(RoundAnswers* answers) { Close(ErrorKind::kOk, "", answers); }

void Round::Close(ErrorKind kind, const std::string& message, RoundAnswers* answers) {
  closed_error_ = message;
  closed_kind_ = kind;
  last_closed_ = std::max(last_closed_, round_);
  active_ = false;
  contributors_.clear();
  covered_.clear();
  answers->Release();
}

void Round::GiveUp(const Arrival& arrival, RoundAnswers* answers) {
  const std::string why =
      WorkerRank(arrival.rank) + " gave up round " + std::to_string(arrival.round) + " of tensor " +
      answers->Tensor(arrival.rank) + " (its operation failed or timed out there)";
  if (active_ && arrival.round >= round_) {
    Fail(ErrorKind::kAborted, why, answers);
    last_closed_ = arrival.round;
  } else if (!active_ && arrival.round > last_closed_) {
    // Whoever contributes to it later hears why it ended.
    last_closed_ = arrival.round;
    closed_error_ = why;
    closed_kind_ = ErrorKind::kAborted;
  }
}

void Round::Forget(uint32_t rank, RoundAnswers* answers) {
  if (!active_ || !Contains(contributors_, rank)) return;
  Fail(ErrorKind::kPeerGone,
       WorkerRank(rank) + " has shut down, so tensor " + answers->Tensor(rank) + " cannot complete",
       answers);
}

bool Round::Covers(uint32_t rank) const { return Contains(covered_, rank); }

bool Round::IsMember(uint32_t rank) const {
  return std::binary_search(members_.begin(), members_.end(), rank);
}

}  // namespace bps
