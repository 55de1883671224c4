// Unit tests of one key's rounds (rounds/round.h) and of the operation kinds'
// policies (rounds/policy.h), without a server: what a round admits, refuses and
// fails, and who hears which error.
#include "../../custom_ops/rounds/round.h"

#include <cstring>
#include <string>
#include <vector>

#include "../../custom_ops/rounds/async_store.h"
#include "../../custom_ops/rounds/policy.h"
#include "expect.h"

namespace bps {
namespace {

// Records every answer a round gives.
struct Answers : RoundAnswers {
  struct Sent {
    uint32_t rank;
    uint32_t round;
    ErrorKind kind;
    std::string message;
  };
  std::vector<Sent> errors;
  int releases = 0;
  void Error(uint32_t rank, uint32_t round, ErrorKind kind, const std::string& message) override {
    errors.push_back({rank, round, kind, message});
  }
  std::string Tensor(uint32_t) override { return "'w'"; }
  std::string Mismatch(uint32_t a, uint32_t b) override {
    return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " differ";
  }
  void Release() override { ++releases; }
  bool Heard(uint32_t rank, uint32_t round, const std::string& part) const {
    for (const Sent& e : errors)
      if (e.rank == rank && e.round == round && e.message.find(part) != std::string::npos)
        return true;
    return false;
  }
};

struct FixedRoster : Roster {
  std::vector<bool> joined, gone;
  explicit FixedRoster(size_t n) : joined(n, false), gone(n, false) {}
  bool Joined(uint32_t rank, uint16_t) const override { return joined[rank]; }
  bool Gone(uint32_t rank) const override { return gone[rank]; }
};

// Rank `rank` pushes `round` into a round of ranks 0..2; true if it went in.
bool Push(Round& round, Answers& answers, uint32_t rank, uint32_t number, uint16_t epoch = 0) {
  const Arrival arrival{rank, number, epoch};
  switch (round.Admit(arrival, &answers)) {
    case Round::Admission::kRefused:
      return false;
    case Round::Admission::kOpens:
      round.Open(arrival, {0, 1, 2});
      break;
    case Round::Admission::kJoins:
      break;
  }
  return round.Add(arrival, {rank}, 0, &answers);
}

void TestRoundCompletesAndRefusesStale() {
  Round round;
  Answers answers;
  FixedRoster roster(3);
  EXPECT(Push(round, answers, 0, 1) && Push(round, answers, 1, 1));
  EXPECT(round.Check(roster, &answers) == Round::Progress::kWaiting);
  EXPECT(Push(round, answers, 2, 1));
  EXPECT(round.Check(roster, &answers) == Round::Progress::kComplete);
  EXPECT(round.contributors() == (std::vector<uint32_t>{0, 1, 2}));
  round.Succeed(&answers);
  EXPECT(!round.active() && round.last_closed() == 1 && answers.releases == 1);
  // Round 1 is over: a late push of it is refused, naming the round that ended.
  EXPECT(!Push(round, answers, 1, 1));
  EXPECT(answers.Heard(1, 1, "after round 1 had ended"));
  EXPECT(answers.Heard(1, 1, "no stale value"));
}

void TestRoundOutOfStepAndDuplicates() {
  Round round;
  Answers answers;
  EXPECT(Push(round, answers, 0, 3));
  // Rank 1 is a round ahead: both rounds end, each worker hearing about its own.
  EXPECT(!Push(round, answers, 1, 4));
  EXPECT(answers.Heard(0, 3, "out of step") && answers.Heard(1, 4, "out of step"));
  EXPECT(round.last_closed() == 4 && !round.active());
  // A contribution on the other side of a join is told apart by its epoch.
  answers.errors.clear();
  EXPECT(Push(round, answers, 0, 5, 0));
  EXPECT(!Push(round, answers, 2, 5, 1));
  EXPECT(answers.Heard(2, 5, "other side of a join"));
  // The same worker twice in one round fails it once, for everyone in it.
  answers.errors.clear();
  EXPECT(Push(round, answers, 0, 6));
  EXPECT(!Push(round, answers, 0, 6));
  EXPECT(answers.errors.size() == 1 && answers.Heard(0, 6, "arrived twice for worker rank 0"));
}

void TestRoundGiveUpJoinAndGone() {
  Answers answers;
  FixedRoster roster(3);
  {
    // A round given up before it began here is refused to whoever comes later.
    Round round;
    round.GiveUp(Arrival{2, 1, 0}, &answers);
    EXPECT(!Push(round, answers, 0, 1));
    EXPECT(answers.Heard(0, 1, "worker rank 2 gave up round 1 of tensor 'w'"));
    // One given up while in progress ends for its contributors.
    EXPECT(Push(round, answers, 0, 2));
    round.GiveUp(Arrival{1, 2, 0}, &answers);
    EXPECT(answers.Heard(0, 2, "worker rank 1 gave up round 2"));
  }
  {
    // A member that joined takes part with nothing; one that is gone fails the round.
    Round round;
    EXPECT(Push(round, answers, 0, 1) && Push(round, answers, 1, 1));
    roster.joined[2] = true;
    EXPECT(round.Check(roster, &answers) == Round::Progress::kComplete);
    round.Succeed(&answers);
    roster.joined[2] = false;
    roster.gone[2] = true;
    answers.errors.clear();
    EXPECT(Push(round, answers, 0, 2));
    EXPECT(round.Check(roster, &answers) == Round::Progress::kFailed);
    EXPECT(answers.Heard(0, 2, "worker rank 2 has already shut down"));
    // Its own push's late twin hears the same reason.
    EXPECT(!Push(round, answers, 1, 2));
    EXPECT(answers.Heard(1, 2, "has already shut down"));
  }
  {
    // A worker that said Bye ends the open rounds holding its push.
    Round round;
    answers.errors.clear();
    EXPECT(Push(round, answers, 1, 1));
    round.Forget(0, &answers);
    EXPECT(round.active());
    round.Forget(1, &answers);
    EXPECT(!round.active() && answers.Heard(1, 1, "worker rank 1 has shut down"));
  }
}

// Where a policy's result goes when it is not a push's own data.
struct Memory : ResultMemory {
  std::vector<char> shared, owned;
  char* Shared(size_t length) override {
    shared.resize(length);
    return shared.data();
  }
  char* Private(size_t length) override {
    owned.resize(length);
    return owned.data();
  }
};

Contribution Floats(BlockPool* pool, std::vector<float> values) {
  Contribution c;
  c.length = values.size() * sizeof(float);
  c.block = pool->Acquire(c.length);
  std::memcpy(c.block.data.get(), values.data(), c.length);
  return c;
}

void TestPolicies() {
  BlockPool pool;
  Memory memory;
  const std::vector<uint32_t> members{0, 1, 2};
  {
    RoundData data;
    data.spec.kind = OpKind::kPushPull;
    data.spec.dtype = static_cast<uint8_t>(DataType::kFloat32);
    data.spec.length = 2 * sizeof(float);
    const RoundPolicy& reduce = PolicyFor(OpKind::kPushPull);
    reduce.Open(&data, 3);
    reduce.Add(&data, 0, Floats(&pool, {1, 2}), &pool);
    reduce.Add(&data, 1, Floats(&pool, {10, 20}), &pool);
    const float in_shared[2] = {100, 200};  // a same-host push, read where it lies
    Contribution local;
    local.shared = reinterpret_cast<const char*>(in_shared);
    local.length = sizeof(in_shared);
    reduce.Add(&data, 2, std::move(local), &pool);
    size_t length = 0;
    const float* sum = reinterpret_cast<const float*>(
        reduce.Result(&data, ResultContext{1, &members, true}, &memory, &length));
    EXPECT(length == 8 && sum[0] == 111 && sum[1] == 222);
    EXPECT(reduce.Receives(data, 0) && reduce.Receives(data, 2));
    data.Clear(&pool);
  }
  {
    // A broadcast without its root's data cannot end; with it, only the others hear.
    RoundData data;
    const RoundPolicy& broadcast = PolicyFor(OpKind::kBroadcast);
    broadcast.Open(&data, 3);
    EXPECT(!broadcast.Unfinishable(data, "'b'").empty());
    broadcast.Add(&data, 1, Floats(&pool, {5}), &pool);
    broadcast.Add(&data, 0, Contribution{}, &pool);
    EXPECT(broadcast.Unfinishable(data, "'b'").empty());
    EXPECT(broadcast.Receives(data, 0) && !broadcast.Receives(data, 1));
    size_t length = 0;
    const char* out = broadcast.Result(&data, ResultContext{1, &members, false}, &memory, &length);
    EXPECT(length == 4 && *reinterpret_cast<const float*>(out) == 5);
    data.Clear(&pool);
  }
  {
    // A gather's sizes step: every member's rows, then what each pushed.
    RoundData data;
    const RoundPolicy& gather = PolicyFor(OpKind::kAllgather);
    gather.Open(&data, 3);
    for (uint32_t r : members) {
      Contribution c;
      c.rows = r + 1;
      gather.Add(&data, r, std::move(c), &pool);
    }
    size_t length = 0;
    const char* out =
        gather.Result(&data, ResultContext{kSizesPart, &members, false}, &memory, &length);
    EXPECT(length == 3 * sizeof(int64_t));
    EXPECT(reinterpret_cast<const int64_t*>(out)[2] == 3);
    data.Clear(&pool);
  }
}

void TestAsyncStore() {
  BlockPool pool;
  Answers answers;
  RoundSpec spec;
  spec.kind = OpKind::kAsyncPushPull;
  spec.dtype = static_cast<uint8_t>(DataType::kFloat32);
  spec.length = sizeof(float);
  AsyncStore store;
  store.Start(1, spec, 2);
  const float one = 1, two = 2;
  std::vector<Arrival> replies;
  // Rank 1's first push waits for rank 0's values; rank 0's answers both.
  EXPECT(store.Push(Arrival{1, 1, 0}, spec, reinterpret_cast<const char*>(&one), &pool, &answers,
                    &replies));
  EXPECT(replies.empty());
  EXPECT(store.Push(Arrival{0, 1, 0}, spec, reinterpret_cast<const char*>(&two), &pool, &answers,
                    &replies));
  EXPECT(replies.size() == 2 && *reinterpret_cast<const float*>(store.parameters()) == 2);
  // A later push adds its delta; an old round is refused.
  EXPECT(store.Push(Arrival{1, 2, 0}, spec, reinterpret_cast<const char*>(&one), &pool, &answers,
                    &replies));
  EXPECT(*reinterpret_cast<const float*>(store.parameters()) == 3);
  EXPECT(!store.Push(Arrival{1, 2, 0}, spec, reinterpret_cast<const char*>(&one), &pool, &answers,
                     &replies));
  EXPECT(answers.Heard(1, 2, "no update is applied twice"));
  store.Release(&pool);
}

}  // namespace

void TestRounds() {
  TestRoundCompletesAndRefusesStale();
  TestRoundOutOfStepAndDuplicates();
  TestRoundGiveUpJoinAndGone();
  TestPolicies();
  TestAsyncStore();
}

}  // namespace bps
