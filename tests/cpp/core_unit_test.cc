// Unit tests of the core's pieces, in one process: reduce kernels, the wire
// format, the transports, and the server's round policies driven through real
// sockets.
// Built and run by tests/test_core_units.py.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../custom_ops/common/reduce.h"
#include "../../custom_ops/control/json.h"
#include "../../custom_ops/control/settings.h"
#include "../../custom_ops/server/server.h"
#include "../../custom_ops/wire/auth.h"
#include "../../custom_ops/wire/protocol.h"
#include "../../custom_ops/wire/shm/shared_memory_channel.h"
#include "../../custom_ops/wire/tcp/tcp_transport.h"
#include "../../custom_ops/wire/transport.h"
#include "../../custom_ops/worker/credits.h"
#include "../../custom_ops/worker/server_routes.h"
#include "../../custom_ops/worker/stage.h"
#include "../../custom_ops/worker/task.h"
#include "expect.h"

namespace bps {
namespace {

const char kToken[] = "unit-test-token";

// ---------------------------------------------------------------------------
// Reduce kernels

template <typename T>
void CheckReductions(DataType dtype, const std::vector<T>& a, const std::vector<T>& b) {
  const std::vector<std::pair<ReduceOp, std::function<double(double, double)>>> ops = {
      {ReduceOp::kSum, [](double x, double y) { return x + y; }},
      {ReduceOp::kAverage, [](double x, double y) { return x + y; }},
      {ReduceOp::kMin, [](double x, double y) { return std::min(x, y); }},
      {ReduceOp::kMax, [](double x, double y) { return std::max(x, y); }},
      {ReduceOp::kProduct, [](double x, double y) { return x * y; }},
  };
  for (const auto& [op, reference] : ops) {
    std::vector<T> out(a.size()), in_place = a;
    ReduceOf(op, dtype, out.data(), a.data(), b.data(), a.size());
    ReduceInto(op, dtype, in_place.data(), b.data(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const double want = reference(static_cast<double>(a[i]), static_cast<double>(b[i]));
      EXPECT(static_cast<double>(out[i]) == want);
      EXPECT(static_cast<double>(in_place[i]) == want);
    }
  }
}

void TestReduceKernels() {
  // Long enough for the vectorised loops' main body and their tails.
  std::vector<int> base(37), other(37);
  for (int i = 0; i < 37; ++i) {
    base[i] = (i * 7) % 7 - 3;
    other[i] = (i * 5) % 7 - 3;
  }
  auto as = [](const std::vector<int>& v, auto tag, int shift = 0) {
    std::vector<decltype(tag)> out;
    for (int x : v) out.push_back(static_cast<decltype(tag)>(x + shift));
    return out;
  };
  CheckReductions(DataType::kFloat32, as(base, float{}), as(other, float{}));
  CheckReductions(DataType::kFloat64, as(base, double{}), as(other, double{}));
  CheckReductions(DataType::kInt32, as(base, int32_t{}), as(other, int32_t{}));
  CheckReductions(DataType::kInt64, as(base, int64_t{}), as(other, int64_t{}));
  CheckReductions(DataType::kInt16, as(base, int16_t{}), as(other, int16_t{}));
  CheckReductions(DataType::kInt8, as(base, int8_t{}), as(other, int8_t{}));
  CheckReductions(DataType::kUint8, as(base, uint8_t{}, 3), as(other, uint8_t{}, 3));
  CheckReductions(DataType::kUint16, as(base, uint16_t{}, 3), as(other, uint16_t{}, 3));
  CheckReductions(DataType::kFloat16, as(base, _Float16{}), as(other, _Float16{}));

  // bfloat16 rounds to nearest even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
  const uint16_t one = 0x3f80, step = 0x3b80;  // 1.0 and 2^-8 as bfloat16
  uint16_t sum = 0;
  ReduceOf(ReduceOp::kSum, DataType::kBFloat16, &sum, &one, &step, 1);
  EXPECT(sum == one);

  // Integers divide by flooring (as numpy and TensorFlow), and scale by truncating.
  std::vector<int32_t> ints = {-7, 7, -6, 0};
  DivideInPlace(DataType::kInt32, ints.data(), ints.size(), 2);
  EXPECT((ints == std::vector<int32_t>{-4, 3, -3, 0}));
  ints = {-7, 7, 3, 1};
  ScaleInPlace(DataType::kInt32, ints.data(), ints.size(), 0.5);
  EXPECT((ints == std::vector<int32_t>{-3, 3, 1, 0}));
  std::vector<float> floats = {1.0f, -3.0f};
  ScaleInPlace(DataType::kFloat32, floats.data(), floats.size(), 0.25);
  EXPECT((floats == std::vector<float>{0.25f, -0.75f}));
  EXPECT(!CanReduce(DataType::kBool) && CanReduce(DataType::kUint8));
}

// ---------------------------------------------------------------------------
// Wire format

Declaration SampleDeclaration() {
  Declaration d;
  d.name = "layer/kernel:0";
  d.kind = OpKind::kBroadcast;
  d.dtype = DataType::kBFloat16;
  d.shape = {3, 0, 5};
  d.reduce_op = ReduceOp::kMax;
  d.root_rank = 2;
  d.prescale = 0.5;
  d.postscale = 4.0;
  return d;
}

void TestDeclarations() {
  const Declaration d = SampleDeclaration();
  const std::string bytes = EncodeDeclaration(d);
  Declaration back;
  EXPECT(DecodeDeclaration(bytes, &back));
  EXPECT(back.name == d.name && back.kind == d.kind && back.dtype == d.dtype &&
         back.shape == d.shape && back.reduce_op == d.reduce_op && back.root_rank == 2 &&
         back.prescale == 0.5 && back.postscale == 4.0);
  // Every truncation, and any trailing byte, is refused.
  for (size_t n = 0; n < bytes.size(); ++n) EXPECT(!DecodeDeclaration(bytes.substr(0, n), &back));
  EXPECT(!DecodeDeclaration(bytes + "x", &back));
  // A claimed name of 4 GB is refused before anything is allocated.
  std::string huge = bytes;
  const uint32_t claim = 0xffffffffu;
  std::memcpy(huge.data(), &claim, sizeof(claim));
  EXPECT(!DecodeDeclaration(huge, &back));
  // Unknown kinds, dtypes and reduce ops are refused.
  std::string bad = bytes;
  bad[4 + d.name.size()] = 9;
  EXPECT(!DecodeDeclaration(bad, &back));
}

void TestSignatures() {
  Declaration a = SampleDeclaration(), b = a;
  b.name = "another name";
  EXPECT(Signature(a) == Signature(b));  // Names are matched by id, not signature.
  b.root_rank = 1;
  EXPECT(Signature(a) != Signature(b));
  a.kind = b.kind = OpKind::kPushPull;  // A root means nothing to a reduction.
  EXPECT(Signature(a) == Signature(b));
  b.prescale = 1.0;
  EXPECT(Signature(a) != Signature(b));
  Declaration g = SampleDeclaration(), h = g;
  g.kind = h.kind = OpKind::kAllgather;
  h.shape[0] = 7;  // The first dimension of an allgather may differ ...
  EXPECT(Signature(g) == Signature(h));
  h.shape[2] = 6;  // ... the others may not.
  EXPECT(Signature(g) != Signature(h));
  EXPECT(Describe(SampleDeclaration()) ==
         "broadcast from rank 2 of bfloat16[3,0,5] prescaled by 0.5 postscaled by 4");
}

// ---------------------------------------------------------------------------
// Partitioning rules

void TestScatterSplits() {
  // 7 rows over 3 ranks: 3, 2, 2, back to back and covering every row.
  EXPECT(ScatterRows(7, 0, 3) == 3 && ScatterRows(7, 1, 3) == 2 && ScatterRows(7, 2, 3) == 2);
  EXPECT(ScatterFirstRow(7, 0, 3) == 0 && ScatterFirstRow(7, 1, 3) == 3 &&
         ScatterFirstRow(7, 2, 3) == 5);
  for (int64_t rows : {0, 1, 5, 64, 1001}) {
    for (int size : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int rank = 0; rank < size; ++rank) {
        EXPECT(ScatterFirstRow(rows, rank, size) == next);
        next += ScatterRows(rows, rank, size);
      }
      EXPECT(next == rows);
    }
  }
}

void TestEvenPartitions() {
  constexpr size_t kDefault = 4096000, kMiB = 1 << 20;
  // 64 MiB: 17 default pieces would deal 5/4/4/4 over 4 servers; 20 deal 5 each.
  EXPECT(EvenPartitionBytes(64 * kMiB, 4, kDefault, 4) == (64 * kMiB / 4 + 19) / 20 * 4);
  for (size_t servers : {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{8}}) {
    for (size_t bytes : {4 * kMiB, 64 * kMiB, 3 * kMiB + 12, size_t{4000}}) {
      const size_t piece = EvenPartitionBytes(bytes, 4, kDefault, servers);
      const size_t pieces = (bytes + piece - 1) / piece;
      EXPECT(piece % 4 == 0 && piece <= kDefault);
      // Every server works once partitions may shrink (to the floor) to allow it...
      if (bytes >= servers * kMinSpreadBytes) EXPECT(pieces >= servers);
      // ...and a large tensor gives every server the same number of pieces.
      if (bytes == 64 * kMiB) EXPECT(pieces % servers == 0);
    }
  }
  // A 4 MiB tensor over 8 servers: 8 pieces of 512 KiB, not 2 of 4096000 bytes.
  EXPECT(EvenPartitionBytes(4 * kMiB, 4, kDefault, 8) == kMiB / 2);
  // A small BYTEPS_PARTITION_BYTES is kept as it is: no spreading below the floor.
  EXPECT(EvenPartitionBytes(48, 4, 16, 2) == 16);
  EXPECT(EvenPartitionBytes(0, 4, kDefault, 2) == kDefault);
  // Across hosts: pieces of 128 KiB (a whole number per server), or smaller if asked.
  EXPECT(EvenPartitionBytes(64 * kMiB, 4, kDefault, 2, true) == kNetworkPartitionBytes);
  EXPECT(EvenPartitionBytes(64 * kMiB, 4, kDefault, 3, true) < kNetworkPartitionBytes);
  EXPECT(EvenPartitionBytes(4 * kMiB, 4, 4096, 2, true) == 4096);
  for (size_t bytes : {size_t{1024} * kMiB, size_t{256} * 1024, size_t{4000}})
    EXPECT(EvenPartitionBytes(bytes, 4, kDefault, 2, true) ==
           EvenPartitionBytes(bytes, 4, kNetworkPartitionBytes, 2));
}

void TestServerCycle() {
  // No shares: every server once, in order (the layout of every job but the hybrid).
  EXPECT((ServerCycle({}, 3) == std::vector<int>{0, 1, 2}));
  // The hybrid layout's 1:1:2: each server its share, the large one never twice in a row.
  EXPECT((ServerCycle({1, 1, 2}, 3) == std::vector<int>{2, 0, 1, 2}));
  const std::vector<int> cycle = ServerCycle({1, 1, 1, 1, 3, 3, 0}, 7);
  EXPECT(cycle.size() == 10);
  for (int server = 0; server < 7; ++server)
    EXPECT(std::count(cycle.begin(), cycle.end(), server) == (server < 4 ? 1 : server < 6 ? 3 : 0));
  for (size_t i = 0; i < cycle.size(); ++i) EXPECT(cycle[i] != cycle[(i + 1) % cycle.size()]);
  // 64 MiB across hosts over that cycle: a whole number of cycles, so shares are exact.
  const size_t piece = EvenPartitionBytes(64 << 20, 4, 4096000, cycle.size(), true);
  EXPECT(piece <= kNetworkPartitionBytes && ((64 << 20) + piece - 1) / piece % cycle.size() == 0);
}

void TestTaskSpecChecks() {
  Group pair;
  pair.ranks = {0, 2};
  TaskSpec spec;
  spec.op.name = "t";
  spec.op.kind = OpKind::kBroadcast;
  spec.op.shape = {4};
  spec.bytes = 16;
  float data[4] = {};
  spec.input = data;
  spec.output = data;
  spec.op.root_rank = 2;
  EXPECT(CheckTaskSpec(spec, pair).ok());
  spec.op.root_rank = 1;  // Not in the group.
  EXPECT(CheckTaskSpec(spec, pair).kind() == ErrorKind::kInvalidArgument);
  spec.op.root_rank = 0;
  spec.bytes = 12;  // Does not make float32[4].
  EXPECT(!CheckTaskSpec(spec, pair).ok());
  spec.bytes = 16;
  spec.op.kind = OpKind::kAlltoall;
  spec.output = nullptr;
  spec.splits = {3, 2};  // Adds up to 5 rows, the tensor has 4.
  EXPECT(!CheckTaskSpec(spec, pair).ok());
  spec.splits = {3, 1};
  EXPECT(CheckTaskSpec(spec, pair).ok());
  spec.op.kind = OpKind::kPushPull;
  spec.op.dtype = DataType::kBool;  // Nothing to add up.
  spec.output = data;
  spec.bytes = 4;
  EXPECT(!CheckTaskSpec(spec, pair).ok());
}

// ---------------------------------------------------------------------------
// Pipeline stages

void TestStageServesByPriority() {
  Stage<int, std::greater<int>> stage("test");  // Smallest first.
  for (int item : {5, 1, 4, 2, 3}) stage.Push(item);
  std::vector<int> served;
  std::mutex mutex;
  std::condition_variable done;
  stage.Start([&](int& item) {
    std::lock_guard<std::mutex> lock(mutex);
    served.push_back(item);
    done.notify_all();
    return item != 4;  // Serving stops when it returns false.
  });
  std::unique_lock<std::mutex> lock(mutex);
  EXPECT(done.wait_for(lock, std::chrono::seconds(5), [&] { return served.size() == 4; }));
  lock.unlock();
  stage.Push(0);  // Never served: the stage has ended.
  stage.Join();
  EXPECT((served == std::vector<int>{1, 2, 3, 4}));
}

void TestPushCredits() {
  PushCredits credits(100);
  EXPECT(credits.TryTake(10, 60));
  EXPECT(credits.TryTake(11, 40));   // exactly the limit
  EXPECT(!credits.TryTake(12, 1));   // over it, and ordered after what is in flight
  EXPECT(credits.TryTake(5, 1000));  // ordered before everything in flight: goes
  EXPECT(credits.in_flight() == 1100);
  credits.Return(5, 1000);
  credits.Return(10, 60);
  EXPECT(credits.TryTake(12, 60));
  credits.Return(99, 7);  // never taken: changes nothing
  EXPECT(credits.in_flight() == 100);
  // No answer and no push for the patience: the next one goes anyway.
  EXPECT(!credits.TryTake(13, 1));
  std::this_thread::sleep_for(PushCredits::kPatience + std::chrono::milliseconds(20));
  EXPECT(credits.TryTake(13, 1));
  EXPECT(!credits.TryTake(14, 1));  // that push was progress: patience starts again

  PushCredits unlimited(0);
  for (uint64_t i = 0; i < 100; ++i) EXPECT(unlimited.TryTake(100 - i, 1 << 30));
}

void TestStageHoldsItemsUntilAdmitted() {
  Stage<int, std::greater<int>> stage("test");
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int> served;
  int allowance = 1;  // guarded by mutex
  stage.Start(
      [&](int& item) {
        std::lock_guard<std::mutex> lock(mutex);
        served.push_back(item);
        changed.notify_all();
        return true;
      },
      [&](const int&) {
        std::lock_guard<std::mutex> lock(mutex);
        if (allowance == 0) return false;
        --allowance;
        return true;
      });
  for (int item : {3, 1, 2}) stage.Push(item);
  std::unique_lock<std::mutex> lock(mutex);
  EXPECT(changed.wait_for(lock, std::chrono::seconds(5), [&] { return served.size() == 1; }));
  EXPECT(!changed.wait_for(lock, std::chrono::milliseconds(200),
                           [&] { return served.size() > 1; }));  // held back
  allowance = 2;
  lock.unlock();
  stage.Recheck();
  lock.lock();
  EXPECT(changed.wait_for(lock, std::chrono::seconds(5), [&] { return served.size() == 3; }));
  lock.unlock();
  stage.Close();
  stage.Join();
  EXPECT(served.size() == 3 && served[1] < served[2]);  // admitted ones leave by priority
}

// ---------------------------------------------------------------------------
// Transports, over a socket pair

// A channel pair over a Unix socket pair: the worker side stages its pushes in
// shared memory; the server side shares what lies in `results`' table.
void MakeSharedMemoryPair(std::shared_ptr<SharedSlots> results, std::unique_ptr<Channel>* worker,
                          std::unique_ptr<Channel>* server) {
  int fds[2];
  EXPECT(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  *worker = std::make_unique<SharedMemoryChannel>(
      std::make_unique<Connection>(fds[0], "server"),
      std::make_shared<SharedSlots>(std::make_shared<ArenaTable>()),
      SharedMemoryChannel::Side::kWorker);
  *server =
      std::make_unique<SharedMemoryChannel>(std::make_unique<Connection>(fds[1], "worker"),
                                            std::move(results), SharedMemoryChannel::Side::kServer);
}

FrameHeader DataHeader(FrameType type, size_t bytes) {
  FrameHeader header;
  header.type = static_cast<uint8_t>(type);
  header.tensor_id = 42;
  header.length = bytes;
  return header;
}

void TestTransports() {
  const std::vector<float> data = {1.5f, -2.0f, 3.25f, 8.0f};
  const size_t bytes = data.size() * sizeof(float);
  const SlotKey key{{42, 1}, 0};
  FrameHeader header;
  DataReader payload;
  bool eof = false;
  auto read_reply = [&](Channel& channel) {
    std::vector<float> got(data.size());
    EXPECT(channel.Receive(&header, &payload, &eof).ok());
    EXPECT(header.type == static_cast<uint8_t>(FrameType::kReply) && header.length == bytes);
    EXPECT(payload.Read(got.data(), bytes).ok() && payload.remaining() == 0);
    return got;
  };

  // Shared memory: a push arrives as a view into the worker's slot, not a copy.
  auto results = std::make_shared<SharedSlots>(std::make_shared<ArenaTable>());
  std::unique_ptr<Channel> worker, server, other_worker, other_server;
  MakeSharedMemoryPair(results, &worker, &server);
  MakeSharedMemoryPair(results, &other_worker, &other_server);
  EXPECT(worker->SendData(DataHeader(FrameType::kPush, bytes), data.data(), key).ok());
  EXPECT(server->Receive(&header, &payload, &eof).ok());
  EXPECT(header.type == static_cast<uint8_t>(FrameType::kPush) && header.length == bytes);
  const char* pushed = payload.View(bytes);
  EXPECT(pushed && std::memcmp(pushed, data.data(), bytes) == 0);

  // What one worker pushed reaches another worker as bytes: a worker's memory is
  // read by its own server only, so that it knows when nobody reads it any more.
  EXPECT(other_server->SendData(DataHeader(FrameType::kReply, bytes), pushed, key).ok());
  EXPECT(read_reply(*other_worker) == data);

  // A result computed into the shared slots reaches the worker as a location; one
  // elsewhere goes over the socket; both read the same through the reader.
  char* slot = nullptr;
  ShmLocation location;
  EXPECT(results->Slot(key, bytes, &slot, &location).ok());
  std::memcpy(slot, data.data(), bytes);
  for (const void* source :
       {static_cast<const void*>(slot), static_cast<const void*>(data.data())}) {
    EXPECT(server->SendData(DataHeader(FrameType::kReply, bytes), source, key).ok());
    EXPECT(read_reply(*worker) == data);
  }

  // A location outside what the peer announced drops the connection, not the process.
  FrameHeader forged = DataHeader(FrameType::kPushShm, sizeof(ShmLocation));
  const ShmLocation outside{0, 0, 1ull << 40, 16};
  EXPECT(worker->Send(forged, &outside).ok());
  EXPECT(!server->Receive(&header, &payload, &eof).ok());

  // So does an arena announced larger than its descriptor.
  std::shared_ptr<SharedArena> small;
  EXPECT(SharedArena::Create(4096, &small).ok());
  FrameHeader lie = DataHeader(FrameType::kArena, sizeof(ArenaAnnouncement));
  const ArenaAnnouncement claim{7, 0, 1ull << 30};
  int fds[2];
  EXPECT(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  Connection liar(fds[0], "server");
  SharedMemoryChannel victim(std::make_unique<Connection>(fds[1], "liar"), results,
                             SharedMemoryChannel::Side::kServer);
  EXPECT(liar.Send(lie, &claim, small->fd()).ok());
  Status refused = victim.Receive(&header, &payload, &eof);
  EXPECT(!refused.ok() && refused.message().find("announced") != std::string::npos);

  // A descriptor that is not sealed against resizing (it could shrink under our reads)
  // is refused, and so is an arena numbered past the cap.
  const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
  EXPECT(unsealed >= 0 && ::ftruncate(unsealed, 4096) == 0);
  const ArenaAnnouncement honest_size{0, 0, 4096};
  EXPECT(liar.Send(lie, &honest_size, unsealed).ok());
  refused = victim.Receive(&header, &payload, &eof);
  EXPECT(!refused.ok() && refused.message().find("sealed") != std::string::npos);
  ::close(unsealed);
  std::shared_ptr<SharedArena> arena;
  EXPECT(SharedArena::Create(4096, &arena).ok());
  PeerArenas peer_arenas;
  EXPECT(!peer_arenas.Add(PeerArenas::kMaxPeerArenas, arena).ok());
  // Peers get a descriptor they cannot map writable.
  EXPECT(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, arena->fd(), 0) == MAP_FAILED);
  EXPECT(::ftruncate(arena->fd(), 0) != 0);

  // Sockets: the bytes themselves, read in pieces.
  EXPECT(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  SocketChannel a(std::make_unique<Connection>(fds[0], "b")),
      b(std::make_unique<Connection>(fds[1], "a"));
  EXPECT(a.SendData(DataHeader(FrameType::kPush, bytes), data.data(), key).ok());
  EXPECT(b.Receive(&header, &payload, &eof).ok());
  EXPECT(payload.View(bytes) == nullptr);
  std::vector<float> got(data.size());
  EXPECT(payload.Read(got.data(), sizeof(float)).ok());
  EXPECT(payload.Read(got.data() + 1, bytes - sizeof(float)).ok() && got == data);
  EXPECT(!payload.Read(got.data(), 1).ok());  // Past the frame's end.
}

// ---------------------------------------------------------------------------
// The job token

std::string Hex(const Digest& digest) {
  static const char kDigits[] = "0123456789abcdef";
  std::string text;
  for (uint8_t byte : digest) text += {kDigits[byte >> 4], kDigits[byte & 15]};
  return text;
}

void TestTokenProofs() {
  // FIPS 180-2 and RFC 4231 (test case 2) vectors.
  EXPECT(Hex(Sha256("", 0)) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT(Hex(Sha256("abc", 3)) ==
         "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string long_input(1000, 'a');  // several blocks and a two-block tail
  EXPECT(Hex(Sha256(long_input.data(), 56)) ==
         "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  const std::string data = "what do ya want for nothing?";
  EXPECT(Hex(HmacSha256("Jefe", data.data(), data.size())) ==
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");

  // A worker without the token is refused, and a server without it is not trusted.
  for (const char* worker_token : {kToken, "wrong"}) {
    int fds[2];
    EXPECT(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    Connection server(fds[0], "worker");
    Connection worker(fds[1], "server");
    Status worker_side = Status::OK();
    std::thread client([&] { worker_side = AuthenticateServer(worker, worker_token, 1, 2000); });
    uint32_t rank = 99;
    Status server_side = AuthenticateWorker(server, kToken, 2, 2000, &rank);
    if (std::string(worker_token) == kToken) {
      EXPECT(server_side.ok() && rank == 1);
    } else {
      EXPECT(!server_side.ok() && server_side.message().find("token") != std::string::npos);
    }
    server.Shutdown();  // A refused worker waits for no welcome.
    client.join();
    EXPECT(worker_side.ok() == (std::string(worker_token) == kToken));
  }
}

// ---------------------------------------------------------------------------
// Server rounds, through real sockets

class FakeWorker {
 public:
  FakeWorker(int port, uint32_t rank) : rank_(rank) {
    EXPECT(
        ConnectToServer(ServerAddress{"127.0.0.1", port}, "test server", kToken, rank, 5000, &conn_)
            .ok());
  }

  void Push(uint64_t tensor, uint32_t round, OpKind kind, uint64_t signature,
            const std::vector<float>& data, int64_t rows = 0) {
    FrameHeader header = Header(FrameType::kPush, tensor, round, kind);
    header.signature = signature;
    header.dtype = static_cast<uint8_t>(DataType::kFloat32);
    header.rows = rows;
    header.length = data.size() * sizeof(float);
    EXPECT(conn_->Send(header, data.data()).ok());
  }

  void Declare(uint64_t tensor, const Declaration& declaration) {
    const std::string frame = EncodeDeclaration(declaration);
    FrameHeader header = Header(FrameType::kDeclare, tensor, 1, OpKind::kPushPull);
    header.length = frame.size();
    EXPECT(conn_->Send(header, frame.data()).ok());
  }

  // A push of raw bytes (a compressed partition: `rows` elements).
  void PushBytes(uint64_t tensor, uint32_t round, OpKind kind, uint64_t signature,
                 const std::string& bytes, int64_t rows) {
    FrameHeader header = Header(FrameType::kPush, tensor, round, kind);
    header.signature = signature;
    header.dtype = static_cast<uint8_t>(DataType::kFloat32);
    header.rows = rows;
    header.length = bytes.size();
    EXPECT(conn_->Send(header, bytes.data()).ok());
  }

  // A push header claiming `length` bytes, with none of them sent.
  void ClaimPush(uint64_t tensor, uint64_t length) {
    FrameHeader header = Header(FrameType::kPush, tensor, 1, OpKind::kPushPull);
    header.dtype = static_cast<uint8_t>(DataType::kFloat32);
    header.length = length;
    EXPECT(conn_->Send(header, nullptr).ok());
  }

  void Abandon(uint64_t tensor, uint32_t round) {
    EXPECT(
        conn_->Send(Header(FrameType::kAbandon, tensor, round, OpKind::kPushPull), nullptr).ok());
  }

  // The next reply: its header, and its payload as bytes.
  FrameHeader Receive(std::string* payload) {
    FrameHeader header;
    bool eof = false;
    DataReader reader;
    EXPECT(conn_->Receive(&header, &reader, &eof).ok());
    payload->resize(header.length);
    EXPECT(reader.Read(payload->data(), payload->size()).ok());
    return header;
  }

  std::vector<float> ReceiveFloats(uint32_t round) {
    std::string payload;
    FrameHeader header = Receive(&payload);
    EXPECT(header.type == static_cast<uint8_t>(FrameType::kReply) && header.round == round);
    std::vector<float> out(payload.size() / sizeof(float));
    std::memcpy(out.data(), payload.data(), out.size() * sizeof(float));
    return out;
  }

  // The next frame must be an error of `kind` whose message contains `text`.
  void ExpectError(ErrorKind kind, const std::string& text) {
    std::string message;
    FrameHeader header = Receive(&message);
    EXPECT(header.type == static_cast<uint8_t>(FrameType::kError));
    EXPECT(header.error_kind == static_cast<uint8_t>(kind));
    if (message.find(text) == std::string::npos) {
      ++failures;
      std::cerr << "error message '" << message << "' lacks '" << text << "'\n";
    }
  }

  void Join() {
    EXPECT(conn_->Send(Header(FrameType::kJoin, 0, 0, OpKind::kPushPull), nullptr).ok());
  }

  void Bye() {
    EXPECT(conn_->Send(Header(FrameType::kBye, 0, 0, OpKind::kPushPull), nullptr).ok());
  }

 private:
  FrameHeader Header(FrameType type, uint64_t tensor, uint32_t round, OpKind kind) {
    FrameHeader header;
    header.type = static_cast<uint8_t>(type);
    header.op_kind = static_cast<uint8_t>(kind);
    header.rank = rank_;
    header.tensor_id = tensor;
    header.round = round;
    return header;
  }

  uint32_t rank_;
  std::unique_ptr<Channel> conn_;
};

// A push longer than its sender declared (here: nothing declared at all) costs the
// sender its connection before the server allocates anything; the process lives on.
void TestServerRefusesOversizedPushes() {
  ServerOptions options = ServerOptions::From(Settings::Defaults());
  options.token = kToken;
  options.timeout_ms = 5000;
  Server server(options);
  int port = 0;
  EXPECT(server.Listen(&port).ok());
  EXPECT(server.Serve({0}).ok());
  FakeWorker worker(port, 0);
  worker.ClaimPush(9, 1ull << 42);
  for (int i = 0; i < 100 && server.failure().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT(server.failure().find("more than the") != std::string::npos);
  server.Stop();

  // So does a declaration of a tensor beyond the configured maximum.
  options.max_tensor_bytes = 1 << 20;
  Server small(options);
  EXPECT(small.Listen(&port).ok() && small.Serve({0}).ok());
  FakeWorker declarer(port, 0);
  Declaration huge;
  huge.name = "huge";
  huge.shape = {1 << 20, 2};
  declarer.Declare(11, huge);
  for (int i = 0; i < 100 && small.failure().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT(small.failure().find("BYTEPS_MAX_TENSOR_BYTES") != std::string::npos);
  small.Stop();
}

// A compressed push_pull at a server: the reply is the sum compressed again, and a push
// that is not what the declaration's compressor makes (a length for another element
// count, an index out of range) costs its sender the connection, never the server.
void TestServerChecksCompressedPushes() {
  ServerOptions options = ServerOptions::From(Settings::Defaults());
  options.token = kToken;
  options.timeout_ms = 5000;
  Declaration declaration;
  declaration.name = "sparse";
  declaration.kind = OpKind::kCompressedPushPull;
  declaration.shape = {1000};
  declaration.compression = "topk k=2 ef=none momentum=none";
  const uint64_t signature = Signature(declaration);
  const CompressionSetup* setup = nullptr;
  EXPECT(FindCompression(declaration.compression, &setup).ok());
  std::vector<float> values(1000, 0.0f);
  values[3] = 1.5f;
  values[700] = -2.0f;
  std::string push(setup->compressor->CompressedBytes(values.size()), '\0');
  setup->compressor->Compress(values.data(), values.size(), 0, 1, push.data());

  for (const char* mischief : {"", "length", "index"}) {
    Server server(options);
    int port = 0;
    EXPECT(server.Listen(&port).ok() && server.Serve({0}).ok());
    FakeWorker worker(port, 0);
    worker.Declare(21, declaration);
    std::string sent = push;
    int64_t rows = 1000;
    if (std::string(mischief) == "length") rows = 999;  // 16 bytes are topk's of any count
    if (std::string(mischief) == "length") sent += "more";
    if (std::string(mischief) == "index") std::memcpy(sent.data() + 4, "\xff\xff\x00\x00", 4);
    worker.PushBytes(21, 1, OpKind::kCompressedPushPull, signature, sent, rows);
    if (!*mischief) {
      // One worker: the sum is its push, and topk of it keeps the same two elements.
      std::string reply;
      const FrameHeader header = worker.Receive(&reply);
      EXPECT(header.type == static_cast<uint8_t>(FrameType::kReply) && reply == push);
    } else {
      for (int i = 0; i < 100 && server.failure().empty(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const std::string failure = server.failure();
      const char* expected =
          std::string(mischief) == "length" ? "bytes for 999 elements" : "a malformed 'topk k=2";
      if (failure.find(expected) == std::string::npos) {
        ++failures;
        std::cerr << "server failure '" << failure << "' lacks '" << expected << "'\n";
      }
    }
    server.Stop();
  }
}

// Someone on this host bound the server's local socket name first: the worker sees it
// cannot prove the token and reaches the real server over TCP instead.
void TestSquattedLocalSocketIsNotTrusted() {
  int probe = -1, port = 0;
  EXPECT(ListenTcp("127.0.0.1", 0, &probe, &port).ok());
  ::close(probe);
  int squatter_fd = -1;
  EXPECT(ListenLocal(ServerSocketName(kToken, port), &squatter_fd).ok());
  std::thread squatter([&] {
    int fd = ::accept(squatter_fd, nullptr, nullptr);
    if (fd < 0) return;
    Connection fake(fd, "worker");
    uint32_t rank = 0;
    AuthenticateWorker(fake, "a guess", 1, 2000, &rank);  // Sees a proof it cannot check.
  });
  ServerOptions options = ServerOptions::From(Settings::Defaults());
  options.token = kToken;
  options.port = port;
  Server server(options);
  int bound = 0;
  EXPECT(server.Listen(&bound).ok() && bound == port);  // TCP only: the name is taken.
  EXPECT(server.Serve({0}).ok());
  std::unique_ptr<Channel> channel;
  EXPECT(
      ConnectToServer(ServerAddress{"127.0.0.1", port, true}, "server", kToken, 0, 5000, &channel)
          .ok());
  EXPECT(channel && !channel->shares_memory());
  squatter.join();
  ::close(squatter_fd);
  server.Stop();
}

// A server of one job generation takes no worker of another, over TCP or its local
// socket, and the worker hears why; one of its own generation gets in.
void TestGenerations() {
  ServerOptions options = ServerOptions::From(Settings::Defaults());
  options.token = kToken;
  Server server(options);
  int port = 0;
  EXPECT(server.Listen(&port).ok());
  EXPECT(server.Serve({0}, 2).ok());
  for (bool same_host : {false, true}) {
    std::unique_ptr<Channel> channel;
    Status stale = ConnectToServer(ServerAddress{"127.0.0.1", port, same_host}, "server", kToken, 0,
                                   2000, &channel, nullptr, nullptr, 1);
    EXPECT(!stale.ok());
  }
  std::unique_ptr<Channel> channel;
  EXPECT(ConnectToServer(ServerAddress{"127.0.0.1", port}, "server", kToken, 0, 2000, &channel,
                         nullptr, nullptr, 2)
             .ok());
  server.Stop();
}

void TestServerRounds() {
  ServerOptions options = ServerOptions::From(Settings::Defaults());
  options.token = kToken;
  options.engine_threads = 2;
  options.timeout_ms = 5000;
  Server server(options);
  int port = 0;
  EXPECT(server.Listen(&port).ok());
  EXPECT(server.Serve({0, 1}).ok());
  FakeWorker w0(port, 0), w1(port, 1);

  // A reduction: both get the sum, tagged with the round.
  w0.Push(1, 1, OpKind::kPushPull, 7, {1, 2});
  w1.Push(1, 1, OpKind::kPushPull, 7, {10, 20});
  EXPECT((w0.ReceiveFloats(1) == std::vector<float>{11, 22}));
  EXPECT((w1.ReceiveFloats(1) == std::vector<float>{11, 22}));

  // Rank 0 gave up round 2 before rank 1 pushed it: rank 1's push is refused and
  // round 3 is clean.
  w0.Abandon(1, 2);
  w1.Push(1, 2, OpKind::kPushPull, 7, {100, 100});
  w1.ExpectError(ErrorKind::kAborted, "worker rank 0 gave up round 2");
  w0.Push(1, 3, OpKind::kPushPull, 7, {1, 1});
  w1.Push(1, 3, OpKind::kPushPull, 7, {2, 2});
  EXPECT((w0.ReceiveFloats(3) == std::vector<float>{3, 3}));
  EXPECT((w1.ReceiveFloats(3) == std::vector<float>{3, 3}));

  // Out of step: both hear it, and neither round completes.
  w0.Push(1, 5, OpKind::kPushPull, 7, {1, 1});
  w1.Push(1, 6, OpKind::kPushPull, 7, {1, 1});
  w0.ExpectError(ErrorKind::kAborted, "out of step");
  w1.ExpectError(ErrorKind::kAborted, "out of step");

  // A mismatch fails the round for both at once.
  w0.Push(2, 1, OpKind::kPushPull, 7, {1, 1});
  w1.Push(2, 1, OpKind::kPushPull, 8, {1, 1});
  w0.ExpectError(ErrorKind::kMismatch, "different sizes");
  w1.ExpectError(ErrorKind::kMismatch, "different sizes");

  // Broadcast from rank 1: rank 0 sends nothing and receives the root's data once;
  // the root gets an empty acknowledgement.
  w0.Push(3, 1, OpKind::kBroadcast, 9, {});
  w1.Push(3, 1, OpKind::kBroadcast, 9, {4, 5, 6});
  EXPECT((w0.ReceiveFloats(1) == std::vector<float>{4, 5, 6}));
  EXPECT(w1.ReceiveFloats(1).empty());

  // Allgather: a table of row counts, then the rows in rank order.
  w1.Push(4, 1, OpKind::kAllgather, 10, {7, 8}, 2);
  w0.Push(4, 1, OpKind::kAllgather, 10, {9}, 1);
  for (FakeWorker* w : {&w0, &w1}) {
    std::string payload;
    FrameHeader header = w->Receive(&payload);
    EXPECT(header.type == static_cast<uint8_t>(FrameType::kReply));
    EXPECT(payload.size() == 2 * sizeof(int64_t) + 3 * sizeof(float));
    int64_t rows[2];
    float values[3];
    std::memcpy(rows, payload.data(), sizeof(rows));
    std::memcpy(values, payload.data() + sizeof(rows), sizeof(values));
    EXPECT(rows[0] == 1 && rows[1] == 2);
    EXPECT(values[0] == 9 && values[1] == 7 && values[2] == 8);
  }
  // Join: once rank 0 has joined, rank 1's rounds complete without it; when both
  // have, each hears the last rank to join and the rounds it may have missed.
  w0.Join();
  w1.Push(5, 1, OpKind::kPushPull, 11, {1, 2});
  EXPECT((w1.ReceiveFloats(1) == std::vector<float>{1, 2}));
  w1.Join();
  for (FakeWorker* w : {&w0, &w1}) {
    std::string payload;
    FrameHeader header = w->Receive(&payload);
    EXPECT(header.type == static_cast<uint8_t>(FrameType::kJoined));
    int32_t last = -1;
    if (payload.size() >= sizeof(last)) std::memcpy(&last, payload.data(), sizeof(last));
    EXPECT(last == 1);
    bool saw_round = false;  // Tensor 5 reached round 1 while rank 0 had joined.
    for (size_t at = sizeof(last); at + 12 <= payload.size(); at += 12) {
      uint64_t tensor;
      uint32_t round;
      std::memcpy(&tensor, payload.data() + at, sizeof(tensor));
      std::memcpy(&round, payload.data() + at + sizeof(tensor), sizeof(round));
      saw_round = saw_round || (tensor == 5 && round == 1);
    }
    EXPECT(saw_round);
  }
  w0.Bye();
  w1.Bye();
  server.Stop();
  EXPECT(server.failure().empty());
}

}  // namespace

// ---------------------------------------------------------------------------
// The control plane: JSON from the scheduler, and the variables' table

void TestJsonParsing() {
  Json message;
  EXPECT(Json::Parse(R"({"type": "book", "server_id": 3, "merge_groups": [0, 0, 1],
                         "reason": "a \"quoted\" \u00e9 \ud83d\ude00", "ok": true,
                         "none": null, "nested": {"x": [1.5e3, -2]}})",
                     &message)
             .ok());
  EXPECT(message["type"].str() == "book");
  int64_t value = -1;
  EXPECT(message["server_id"].AsInt(0, 10, &value) && value == 3);
  EXPECT(!message["server_id"].AsInt(4, 10, &value));
  EXPECT(!message["ok"].AsInt(0, 1, &value));  // A bool is no integer.
  EXPECT(message["merge_groups"].items().size() == 3);
  EXPECT(message["reason"].str() == "a \"quoted\" \xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT(message["nested"]["x"].items()[0].AsInt(0, 2000, &value) && value == 1500);
  EXPECT(message["missing"]["deeper"].type() == Json::Type::kNull);
  // Whatever a stranger sends is refused, never a crash or a partial tree.
  for (const std::string& bad :
       {std::string(""), std::string("{"), std::string(R"({"a"})"), std::string(R"({"a": })"),
        std::string("[1, 2"), std::string("\"open"), std::string(R"({"a": 1} trailing)"),
        std::string("nul"), std::string(R"({"a": "\x"})"), std::string(R"("\u12")"),
        std::string("1e999"), std::string("-"), std::string("[\"\x01\"]"),
        std::string(100, '[') + std::string(100, ']')})
    EXPECT(!Json::Parse(bad, &message).ok());
  EXPECT(Json::Parse(std::string(32, '[') + std::string(32, ']'), &message).ok());
  // A repeated key counts once, the last one, as in Python.
  EXPECT(Json::Parse(R"({"type": "exit", "type": 5})", &message).ok() &&
         message["type"].type() == Json::Type::kNumber && message["type"].str().empty());
  // A message cannot build more than a bounded tree.
  std::string many = "[";
  for (int i = 0; i < 70000; ++i) many += "[],";
  EXPECT(!Json::Parse(many + "[]]", &message).ok());
  // Bytes that are not UTF-8 go out as U+FFFD, so the scheduler can decode them.
  EXPECT(JsonQuote("a\xff\xc3\xa9") == "\"a\xef\xbf\xbd\xc3\xa9\"");
  const std::string odd("q\"\\\n\x01", 5);
  std::string written =
      JsonWriter().Add("type", "hello").Add("n", int64_t{-7}).Add("odd", odd).Finish();
  EXPECT(written == R"({"type": "hello", "n": -7, "odd": "q\"\\\u000a\u0001"})");
  EXPECT(Json::Parse(written, &message).ok() && message["odd"].str() == odd);
}

void TestSettingsTable() {
  auto read = [](std::map<std::string, std::string> env, Settings* settings) {
    return Settings::Read(
        [&env](const char* name) {
          auto found = env.find(name);
          return found == env.end() ? nullptr : found->second.c_str();
        },
        settings);
  };
  Settings settings;
  EXPECT(read({}, &settings).ok());
  EXPECT(settings.Int("BYTEPS_PARTITION_BYTES") == 4096000);  // Defaults from the table.
  EXPECT(settings.Int("DMLC_PS_ROOT_PORT") == -1 && !settings.IsSet("DMLC_PS_ROOT_PORT"));
  EXPECT(settings.Number("BYTEPS_OP_TIMEOUT") == 300 && settings.Flag("BYTEPS_ENABLE_IPC"));
  EXPECT(settings.Text("BYTEPS_LOG_LEVEL") == "WARNING");
  EXPECT(read({{"BYTEPS_LOG_LEVEL", " debug "},
               {"DMLC_NUM_SERVER", "1_0"},
               {"PS_HEARTBEAT_TIMEOUT", "2.5"},
               {"BYTEPS_ENABLE_ASYNC", "1"}},
              &settings)
             .ok());
  EXPECT(settings.Text("BYTEPS_LOG_LEVEL") == "DEBUG" && settings.Int("DMLC_NUM_SERVER") == 10);
  EXPECT(settings.Number("PS_HEARTBEAT_TIMEOUT") == 2.5 && settings.Flag("BYTEPS_ENABLE_ASYNC"));
  EXPECT(read({{"DMLC_NUM_WORKER", "9999"}}, &settings).message() ==
         "DMLC_NUM_WORKER='9999' is not valid: expected an integer from 1 to 4096");
  EXPECT(read({{"PS_HEARTBEAT_TIMEOUT", "inf"}}, &settings).message() ==
         "PS_HEARTBEAT_TIMEOUT='inf' is not valid: expected a number of seconds greater than 0 "
         "and at most 1e+06");
  EXPECT(read({{"DMLC_ROLE", "it's"}}, &settings).message() ==
         "DMLC_ROLE=\"it's\" is not valid: expected one of scheduler, server, worker");
  EXPECT(PythonRepr("a\\b\tc\x7f") == R"('a\\b\tc\x7f')");
}

// The worker's variables: what config.py read, handed over as NAME=value entries.
void TestSettingsFromEntries() {
  Settings settings;
  EXPECT(Settings::FromEntries({"BYTEPS_PARTITION_BYTES=1024", "BYTEPS_DEBUG_SAMPLE_TENSOR=a=b",
                                "CUDA_VISIBLE_DEVICES=0,1", "BYTEPS_LOCAL_RANK=1"},
                               &settings)
             .ok());
  EXPECT(settings.Int("BYTEPS_PARTITION_BYTES") == 1024 &&
         settings.Text("BYTEPS_DEBUG_SAMPLE_TENSOR") == "a=b");
  EXPECT(settings.Int("BYTEPS_MIN_COMPRESS_BYTES") == 65536);  // The table's default.
  EXPECT(Settings::FromEntries({"BYTEPS_PARTITION_BYTES=7"}, &settings).message() ==
         "BYTEPS_PARTITION_BYTES='7' is not valid: expected an integer from 8 to 2147483647");
  EXPECT(Settings::FromEntries({"BYTEPS_PARTITION_BYTES"}, &settings).message() ==
         "bad setting 'BYTEPS_PARTITION_BYTES': expected NAME=value");
  EXPECT(Settings::FromEntries({"BYTEPS_NO_SUCH=1"}, &settings).message() ==
         "BYTEPS_NO_SUCH is not a variable of settings.def");
  EXPECT(Settings::FromEntries({"BYTEPS_ENCRYPT=0", "BYTEPS_ENCRYPT=1"}, &settings).message() ==
         "BYTEPS_ENCRYPT is given twice");
  // BYTEPS_OP_TIMEOUT, else GLOO_TIMEOUT_SECONDS.
  EXPECT(Settings::FromEntries({"GLOO_TIMEOUT_SECONDS=7"}, &settings).ok() &&
         settings.OperationTimeout() == 7);
  EXPECT(Settings::FromEntries({"GLOO_TIMEOUT_SECONDS=7", "BYTEPS_OP_TIMEOUT=9"}, &settings).ok() &&
         settings.OperationTimeout() == 9);
  EXPECT(Settings::Defaults().OperationTimeout() == 300);
}

}  // namespace bps

namespace bps {

void TestServerRoutes() {
  // Three servers, cycle 0 1 2: tensor 4's partitions start at place 1.
  ServerRoutes routes(ServerCycle({}, 3), 3);
  EXPECT(routes.For(4, 0) == 1 && routes.For(4, 1) == 2 && routes.For(4, 2) == 0);
  // Server 1 is lost: only its place changes, to the first server left.
  EXPECT(routes.Remove(1).ok() && routes.removed(1));
  EXPECT(routes.For(4, 0) == 0 && routes.For(4, 1) == 2 && routes.For(4, 2) == 0);
  EXPECT(routes.Remove(1).ok());  // Told twice: nothing changes.
  EXPECT(routes.For(4, 0) == 0);
  // The hybrid 1:1:2 cycle (2 0 1 2) losing server 2: its two places go to 0, then 1,
  // so the servers left share its load.
  ServerRoutes hybrid(ServerCycle({1, 1, 2}, 3), 3);
  EXPECT(hybrid.Remove(2).ok());
  std::vector<int> places;
  for (uint32_t part = 0; part < 4; ++part) places.push_back(hybrid.For(0, part));
  EXPECT((places == std::vector<int>{0, 0, 1, 1}));
  // The last server cannot go; an unknown one is an error.
  EXPECT(hybrid.Remove(0).ok());
  Status last = hybrid.Remove(1);
  EXPECT(!last.ok() && last.kind() == ErrorKind::kPeerGone && !hybrid.removed(1));
  EXPECT(hybrid.For(0, 3) == 1);
  EXPECT(!hybrid.Remove(3).ok() && !hybrid.Remove(-1).ok());
}

}  // namespace bps

int main(int argc, char** argv) {
  // Timings are not checks: printed on request, never as part of the tests.
  if (argc > 1 && std::string(argv[1]) == "--benchmark-compressors") {
    bps::BenchmarkCompressors();
    return 0;
  }
  bps::TestReduceKernels();
  bps::TestDeclarations();
  bps::TestSignatures();
  bps::TestStageServesByPriority();
  bps::TestStageHoldsItemsUntilAdmitted();
  bps::TestPushCredits();
  bps::TestTimelineWindow();
  bps::TestTimelineRecordings();
  bps::TestTimelineSwitchesUnderLoad();
  bps::TestScatterSplits();
  bps::TestEvenPartitions();
  bps::TestServerCycle();
  bps::TestServerRoutes();
  bps::TestTaskSpecChecks();
  bps::TestTransports();
  bps::TestSharedSlots();
  bps::TestDeviceStaging();
  bps::TestTokenProofs();
  bps::TestServerRounds();
  bps::TestGenerations();
  bps::TestRounds();
  bps::TestWaitingRoom();
  bps::TestSealedFrames();
  bps::TestSquattedLocalSocketIsNotTrusted();
  bps::TestServerRefusesOversizedPushes();
  bps::TestServerChecksCompressedPushes();
  bps::TestJsonParsing();
  bps::TestSettingsTable();
  bps::TestSettingsFromEntries();
  bps::TestCompression();
  if (bps::failures) {
    std::cerr << bps::failures << " check(s) failed\n";
    return 1;
  }
  std::cout << "core unit tests passed\n";
  return 0;
}
