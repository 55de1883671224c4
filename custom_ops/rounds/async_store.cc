#include "async_store.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "../common/reduce.h"

namespace bps {

void AsyncStore::Start(uint32_t rank, const RoundSpec& spec, int num_workers) {
  spec_ = spec;
  first_rank_ = rank;
  last_round_.assign(num_workers, 0);
}

bool AsyncStore::Push(const Arrival& arrival, const RoundSpec& spec, const char* data,
                      BlockPool* pool, RoundAnswers* answers, std::vector<Arrival>* replies) {
  const uint32_t rank = arrival.rank;
  const std::string worker = "worker rank " + std::to_string(rank);
  const std::string tensor = "tensor " + answers->Tensor(rank);
  auto refuse = [&](ErrorKind kind, const std::string& why) {
    answers->Error(rank, arrival.round, kind, why);
    return false;
  };
  if (spec.signature != spec_.signature || spec.dtype != spec_.dtype || spec.length != spec_.length)
    return refuse(ErrorKind::kMismatch, answers->Mismatch(first_rank_, rank));
  if (arrival.round <= last_round_[rank])
    return refuse(ErrorKind::kAborted, worker + " sent round " + std::to_string(arrival.round) +
                                           " of " + tensor + " after its round " +
                                           std::to_string(last_round_[rank]) +
                                           "; it is refused so that no update is applied twice");
  const bool first = last_round_[rank] == 0;
  last_round_[rank] = arrival.round;
  if (!parameters_.data) {
    if (!first)
      return refuse(ErrorKind::kAborted, worker + " sent an update of " + tensor +
                                             " before rank 0 gave its initial value");
    if (rank != 0) {  // Every worker starts from rank 0's values.
      waiting_.push_back(arrival);
      return true;
    }
    try {
      parameters_ = pool->Acquire(spec_.length);
    } catch (const std::bad_alloc&) {
      return refuse(ErrorKind::kInternal, "no memory for the parameters of " + tensor);
    }
    std::memcpy(parameters_.data.get(), data, spec_.length);
    replies->insert(replies->end(), waiting_.begin(), waiting_.end());
    waiting_.clear();
  } else if (!first) {  // A first push after rank 0's only fetches the parameters.
    const auto dtype = static_cast<DataType>(spec_.dtype);
    ReduceInto(ReduceOp::kSum, dtype, parameters_.data.get(), data,
               spec_.length / DataTypeSize(dtype));
  }
  replies->push_back(arrival);
  return true;
}

void AsyncStore::GiveUp(uint32_t rank, RoundAnswers* answers) {
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [&](const Arrival& w) { return w.rank == rank; }),
                 waiting_.end());
  if (rank != 0 || parameters_.data) return;
  for (const Arrival& w : waiting_)
    answers->Error(w.rank, w.round, ErrorKind::kAborted,
                   "worker rank 0 gave up its first round of tensor " + answers->Tensor(w.rank) +
                       ", so the servers have no initial parameters to start from");
  waiting_.clear();
}

void AsyncStore::FailWaiting(const std::string& reason, RoundAnswers* answers) {
  for (const Arrival& w : waiting_)
    answers->Error(w.rank, w.round, ErrorKind::kPeerGone,
                   "the job is failing: " + reason + " (tensor " + answers->Tensor(w.rank) + ")");
  waiting_.clear();
}

}  // namespace bps
