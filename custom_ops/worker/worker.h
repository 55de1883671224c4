// The worker side of the core: turns tasks (push_pull, broadcast, allgather, alltoall,
// reducescatter) into partition pushes to the servers and pulls the results straight
// into the output.
//
// Stages (each its own thread, so partitions of one tensor and of many tensors overlap):
//   caller thread  declare (name -> id, once), plan the partitions, enqueue per server
//   local merge    with other workers on this host, push_pull partitions are summed
//                  among them first (local_merge.h); one per host reaches the servers
//   push stage     a Stage per server link (stage.h): sends, highest priority first
//   pull stage     one receiver thread per server link, writes into the output (and
//                  starts a gather's second step once its sizes arrive)
//   watchdog       fails operations that outlive the operation timeout
#ifndef TF_BPS_WORKER_WORKER_H_
#define TF_BPS_WORKER_WORKER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../common/common.h"
#include "../control/settings.h"
#include "../wire/transport.h"
#include "credits.h"
#include "device.h"
#include "device_merge.h"
#include "device_staging.h"
#include "local_merge.h"
#include "op_policy.h"
#include "server_link.h"
#include "server_routes.h"
#include "stage.h"
#include "stats.h"
#include "task.h"
#include "timeline.h"

namespace bps {

// What a worker is told (bps_worker_init): the job's facts, and the job's variables
// (settings.def) in `settings`. A variable is read where it is used, from
// options().settings; the few fields below `settings` are read from it once, by
// ReadSettings, because every operation or several files use them.
struct WorkerOptions {
  // Where nobody gave any (a Worker built directly), the table's defaults.
  WorkerOptions() { ReadSettings(Settings::Defaults()); }
  // Sets `settings` and the fields read from it.
  void ReadSettings(Settings given) {
    settings = std::move(given);
    partition_bytes = static_cast<size_t>(settings.Int("BYTEPS_PARTITION_BYTES"));
    // AIACC's stream count bounds what is in flight where the credit is not set.
    const char* credit = settings.IsSet("BYTEPS_SCHEDULING_CREDIT")
                             ? "BYTEPS_SCHEDULING_CREDIT"
                             : "PERSEUS_ALLREDUCE_STREAMS";
    credit_bytes = partition_bytes * static_cast<size_t>(settings.Int(credit));
    timeout_ms = static_cast<int>(settings.OperationTimeout() * 1000);
    encrypt = settings.Flag("BYTEPS_ENCRYPT");
    debug_sample = settings.Text("BYTEPS_DEBUG_SAMPLE_TENSOR");
    nan_check = settings.Flag("PERSEUS_ALLREDUCE_NANCHECK");
    lost_server_wait_ms = static_cast<int>(settings.Number("PS_HEARTBEAT_TIMEOUT") * 1000);
    min_compress_bytes = static_cast<size_t>(settings.Int("BYTEPS_MIN_COMPRESS_BYTES"));
  }

  int rank = 0;
  int size = 1;
  std::vector<ServerAddress> servers;
  std::string token;  // the job's, proven to every server (wire/auth.h)
  // The workers of this host, ascending, this one included: with more than one,
  // push_pull partitions are merged among them first (local_merge.h).
  std::vector<int32_t> local_ranks;
  // Names this job's local sockets (the rank is appended); unique per job and host.
  std::string local_socket_prefix;
  // The job's workers and servers are on more than one host: partitions are cut for
  // a network (task.h, EvenPartitionBytes). Every worker of a job must agree.
  bool across_hosts = false;
  // How many partitions each server gets, relative to the others (ServerCycle in
  // task.h); empty: the same number. Every worker of a job must agree.
  std::vector<uint32_t> server_shares;
  // The job generation of the address book (FrameHeader::generation).
  uint32_t generation = 0;
  // An elastic, synchronous job: the partitions of a server that went away wait until
  // the scheduler says it is gone from the job, then go to the servers left
  // (MoveLostServer); no step is lost. Otherwise a lost server fails the worker.
  bool move_lost_servers = false;
  // A descriptor (the write end of a pipe, non-blocking) that gets a byte whenever a
  // server is lost: the binding's scheduler link wakes on it and reports the loss.
  int notify_fd = -1;
  // Where tasks on device memory are staged (device.h); null: host tensors only.
  std::shared_ptr<Devices> devices;
  // Where it counts what it did (stats.h): the process's, for its metrics endpoint.
  std::shared_ptr<WorkerStats> stats = std::make_shared<WorkerStats>();

  Settings settings;
  size_t partition_bytes = 0;  // BYTEPS_PARTITION_BYTES
  // BYTEPS_SCHEDULING_CREDIT (else PERSEUS_ALLREDUCE_STREAMS) partitions, in bytes:
  // pushed to one server and not yet answered, at most (credits.h); 0: no limit.
  size_t credit_bytes = 0;
  int timeout_ms = 0;    // Settings::OperationTimeout
  bool encrypt = false;  // BYTEPS_ENCRYPT: frames to servers are sealed (wire/crypto.h)
  // BYTEPS_DEBUG_SAMPLE_TENSOR: a tensor name or id whose values are logged as they
  // enter and leave each stage.
  std::string debug_sample;
  // PERSEUS_ALLREDUCE_NANCHECK: a floating-point push_pull holding NaN or Inf fails
  // before anything is sent (the other workers then fail its round too).
  bool nan_check = false;
  // How long a lost server's partitions wait for the scheduler's word before the
  // worker fails (PS_HEARTBEAT_TIMEOUT, by which the scheduler decides).
  int lost_server_wait_ms = 0;
  // BYTEPS_MIN_COMPRESS_BYTES: a push_pull asking for compression travels whole below
  // this size (ChooseWireKind).
  size_t min_compress_bytes = 0;
};

// The worker engine. Its server links and its local merge report to it through
// their Owner interfaces (server_link.h, local_merge.h), never holding it.
class Worker : public ServerLink::Owner, public LocalMerge::Owner, public DeviceMerge::Owner {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();

  Status Start();
  // Asynchronous: `done` runs once, on a core thread once the output holds the
  // result, or inline when the task is refused.
  void Enqueue(TaskSpec spec, AllocateFn allocate, DoneFn done);
  // Gives tensors their priority before first use, in the order given (earlier goes
  // first); names already known keep theirs. Training declares its gradients in the
  // model's forward order, so the first layers' sums, which the next forward pass
  // needs first, overtake the last layers' (BytePS's priority scheduling).
  void Declare(const std::vector<std::string>& names);
  // Records the operations of steps `first` to `last` that start from now on into the
  // file `path`: BYTEPS_TRACE_ON's window at init, or Horovod's start_timeline (every
  // step) at any time. A recording in progress ends, and this returns once its file is
  // written (as StopTimeline).
  void StartTimeline(const std::string& path, uint32_t first = 1,
                     uint32_t last = Timeline::kEveryStep) {
    timeline_->Start(path, first, last, TimelineWait());
  }
  // The learning rate of the steps whose tasks are enqueued from now on (task.h).
  void SetLearningRate(double rate);
  // Horovod's stop_timeline: ends the recording in progress, if any, and returns once
  // its file is written.
  void StopTimeline() { timeline_->Stop(TimelineWait()); }
  Timeline* timeline() const override { return timeline_.get(); }
  WorkerStats* stats() const override { return options_.stats.get(); }
  // Registers process set `id` (ranks of this job) here and at every server; every
  // worker registers the same sets. No ranks: removes it.
  Status SetProcessSet(uint32_t id, std::vector<int32_t> ranks);
  // Horovod's join: this worker has no more data. Until every worker has joined, the
  // others' rounds go on without it; then it returns the last rank to join. Nothing
  // of this worker may be in flight meanwhile.
  Status Join(int* last_rank);
  // Fails every in-flight and future operation with `reason` (a peer died, say).
  void Abort(const std::string& reason);
  void Stop();
  // Why the worker can no longer push_pull; OK while it is healthy.
  Status fatal_error();

  const WorkerOptions& options() const { return options_; }
  // How far past its answered partitions a tensor's pushes may run, in partitions
  // (0: no limit): as many as the links' credits allow in flight together. Set where
  // the servers' shares differ: each link's credit alone lets the links of small
  // shares run ahead and finish early, and those of large shares then finish alone
  // (examples/benchmarks/network_bound.py shows it on the hybrid layout).
  uint32_t push_window() const { return push_window_; }
  bool stopping() const override { return stopping_.load(); }

  // What the links and the merge report and ask (ServerLink::Owner, LocalMerge::Owner).
  void OnLinkFailure(const std::string& reason) override;
  bool OnServerLost(int server) override;
  // The servers that went away without a word, in the order they did.
  std::vector<int> lost_servers() const;
  // The scheduler says server `server` is gone from the job (move_lost_servers): its
  // places in the cycle go to the servers left, and what waited for it (answers due,
  // partitions queued) is sent to them. Rounds it left unfinished complete there; a
  // round it answered to some workers and not to others cannot, and fails as out of
  // step once the ones it answered push that tensor again.
  Status MoveLostServer(int server);
  void OnAnswer() override;
  Status StartGatherData(const std::shared_ptr<Task>& task,
                         const std::vector<char>& sizes) override;
  void OnJoined(int server, int last_rank,
                const std::unordered_map<uint64_t, uint32_t>& rounds) override;
  void OnStall(uint64_t tensor_id, const std::string& warning) override;
  void Sample(const std::string& name, uint64_t tensor_id, uint32_t round, DataType dtype,
              const char* stage, const void* data, size_t bytes) const override;
  Group GlobalGroup() const override;
  void SendToServer(PartitionTask partition) override;
  void AbandonAtServers(uint64_t tensor_id, uint32_t round, OpKind kind) override;
  // What the device merge asks (DeviceMerge::Owner).
  void RunOnHost(std::shared_ptr<Task> task, std::vector<PartitionTask> plan) override;
  void AbandonPushes(const Task& task, const std::vector<PartitionTask>& plan) override;
  Status SendToPeer(int index, const FrameHeader& header, const std::string& payload) override;
  // PERSEUS_ALLREDUCE_NANCHECK: a reduction whose input (`bytes` at `data`: all of it,
  // or a device tensor's piece on the host) holds NaN or Inf is refused, naming the
  // tensor, this rank and the step.
  Status CheckFinite(const Task& task, const void* data, size_t bytes) const override;

 private:
  // Partitions of a tensor are spread over the servers in their cycle, starting at
  // its id's place.
  ServerLink& LinkFor(uint64_t tensor_id, uint32_t part);
  // A lost server's partition, again, to the server that took its place (push_pull
  // and broadcast; the other kinds cannot resume and fail).
  void SendAgain(PendingPartition partition, const std::string& lost);
  // Fails the worker if a lost server's partitions waited longer than
  // lost_server_wait_ms for the scheduler's word.
  void CheckLostServers(std::chrono::steady_clock::time_point now);
  // A task that fails before its partitions left: every server and local leader that
  // would have received one hears that this worker gave up the round.
  void AbandonUnsent(const Task& task, const std::vector<PartitionTask>& plan);

  struct TensorEntry {
    uint64_t id;
    uint64_t order;
    uint32_t round = 0;  // of the latest task on this tensor
    bool in_flight = false;
  };

  // The registry's entry for `name`, made (with the next priority) if new. Needs
  // registry_mutex_.
  TensorEntry& EntryLocked(const std::string& name);
  // Whether a task may start (refusals name its tensor), and what it needs first: its
  // group, its kind on the wire, an alltoall's even splits, a device tensor's staging.
  Status Admit(TaskSpec* spec, AllocateFn* allocate, Group* group,
               std::shared_ptr<DeviceStaging>* staging);
  // The tensor's next round, now in flight; refused while one is.
  Status NextRound(const std::string& name, TensorEntry* entry);
  // The task whose completion records it on the timeline, samples its result, ends
  // its staging and frees its name before `done` runs.
  std::shared_ptr<Task> MakeTask(TaskSpec spec, Group group, const TensorEntry& entry,
                                 AllocateFn allocate, std::shared_ptr<DeviceStaging> staging,
                                 DoneFn done);
  void WatchdogLoop();
  void OnTaskFinished(const std::string& name, OpKind kind, uint64_t tensor_id, uint32_t round,
                      const Status& status);
  // The workers an operation involves: all, or its process set's (which must hold
  // this worker).
  Status GroupOf(const Declaration& op, Group* group);
  // A planned partition goes on: once its bytes are on the host (a device tensor's,
  // DeviceStaging), to the host's merge (`merged`) or to its server.
  void Dispatch(PartitionTask item, bool merged);
  void Forward(PartitionTask item, bool merged);
  // What the operation kinds' policies plan with (op_policy.h).
  PlanSetup Setup() const;
  // Cuts a task into partitions by its kind's policy (a gather: its sizes step only),
  // after prescaling a copy of the input.
  Status Plan(const std::shared_ptr<Task>& task, std::vector<PartitionTask>* plan);
  // How long ending a timeline recording waits for its file: the operations it took
  // end within the operation timeout (the watchdog fails them then), so it never hangs.
  std::chrono::milliseconds TimelineWait() const {
    return std::chrono::milliseconds(options_.timeout_ms + 1000);
  }

  const WorkerOptions options_;
  ServerRoutes routes_;  // indices of links_ (ServerCycle, less the lost servers)
  const uint32_t push_window_;
  std::vector<std::unique_ptr<ServerLink>> links_;
  std::unique_ptr<LocalMerge> local_;  // with other workers on this host
  // When each tensor's stall was last logged: the servers holding its partitions warn
  // alike, and once in a while is enough.
  std::mutex stalls_mutex_;
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> stalls_logged_;
  // The host's workers' device tensors merge here, where device memory is in use
  // (made with local_).
  std::unique_ptr<DeviceMerge> device_merge_;
  // Where pushes to same-host servers and peers are staged: one table of arenas, so
  // that a host's merged partition reaches a same-host server without another copy.
  const std::shared_ptr<SharedSlots> slots_ =
      std::make_shared<SharedSlots>(std::make_shared<ArenaTable>());

  std::mutex process_sets_mutex_;
  std::unordered_map<uint32_t, std::vector<int32_t>> process_sets_;

  std::mutex join_mutex_;
  std::condition_variable join_cv_;
  int join_replies_ = 0;
  int join_last_ = -1;
  std::unordered_map<uint64_t, uint32_t> join_rounds_;

  std::mutex registry_mutex_;
  // Rounds tensors reached without this worker (while it had joined), by id: where
  // a name first used afterwards starts counting. Guarded by registry_mutex_.
  std::unordered_map<uint64_t, uint32_t> round_floors_;
  std::unordered_map<std::string, TensorEntry> registry_;

  // One for the worker's lifetime, never replaced: stage threads use it without a lock
  // (recordings come and go inside it, timeline.h).
  const std::unique_ptr<Timeline> timeline_ = std::make_unique<Timeline>();

  std::mutex fatal_mutex_;
  Status fatal_ = Status::OK();
  // Tasks on device memory until their completion, which Stop waits for.
  StagedTasks staged_;

  std::atomic<bool> stopping_{false};
  std::atomic<double> learning_rate_{0};  // SetLearningRate's; 0: never told
  struct LostServer {
    int server;
    std::chrono::steady_clock::time_point at;
    bool moved = false;
  };
  mutable std::mutex lost_mutex_;
  std::vector<LostServer> lost_;
  Cancellation start_cancel_;  // An abort during Start() ends its connection attempts.
  std::mutex watchdog_mutex_;
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;
};

}  // namespace bps

#endif  // TF_BPS_WORKER_WORKER_H_
