"""Process-level state of a worker: init, shutdown, rank and size. No TensorFlow."""

from __future__ import annotations

import atexit
import glob
import logging
import os
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass, field

from tf_bps.runtime import core, heap, metrics
from tf_bps.runtime import process_sets as process_sets_module
from tf_bps.runtime.cluster_env import Placement
from tf_bps.runtime.config import Config, configure_logging
from tf_bps.runtime.rendezvous import SchedulerLink

log = logging.getLogger("tf_bps")


@dataclass
class _Job:
    config: Config
    rank: int
    size: int
    local_rank: int  # Among the workers on this host (see membership._local_placement).
    local_size: int
    link: SchedulerLink | None  # None on the single-worker local path.
    worker_hosts: tuple[str, ...] = ()  # By rank; empty on the local path.
    declared: set = field(default_factory=set)  # name lists given to declare()
    generation: int = 0  # of the job's membership (the scheduler's; elastic jobs re-form)
    servers: tuple[str, ...] = ()  # "host:port" each; empty on the local path
    # The pipe on which the core tells of lost servers (read end, write end), if any.
    lost_server_pipe: tuple[int, int] | None = None


_lock = threading.Lock()
_job: _Job | None = None
# Called as (timestamp, added) when the scheduler says the job's hosts changed
# (elastic.State listens, to interrupt training at the next commit).
_host_listeners: list = []
# Weak methods called whenever this worker joined a later generation of the job.
_generation_listeners: list = []
# Why the scheduler let this worker go (its host left the job): it leaves at its next
# commit instead of registering again.
_let_go: str | None = None
_suspended: _Job | None = None  # bps.suspend() left this job; bps.resume() joins again
# The agent running the scheduler or server a cluster manager's placement asked this
# process for (launch/agent.py --cluster-helpers); it ends them once this process is gone.
_cluster_helpers = None
# This process's Prometheus endpoint (BYTEPS_METRICS_PORT), once started: one for the
# process's life, whatever generations an elastic job goes through.
_metrics_port: int | None = None


def _become_server() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "tf_bps.control.server"])


def _start_cluster_helpers(found: Placement) -> subprocess.Popen | None:
    """Starts the scheduler and/or server a cluster manager's placement asks of this
    process, under the launcher's agent (launch/agent.py): a process of its own, which
    ends them once this one is gone (its standard input, ours, closes) and the other
    workers had time to finish."""
    if not (found.starts_scheduler or found.starts_server):
        return None
    return subprocess.Popen([sys.executable, "-m", "tf_bps.launch.agent", found.manager,
                             "--cluster-helpers", "--linger", "30"], stdin=subprocess.PIPE,
                            start_new_session=True)


def init(comm=None, process_sets=None) -> None:
    """Joins the job described by the DMLC_*/BYTEPS_* variables; idempotent.

    `process_sets`: ProcessSets (or rank lists) to register at once, as Horovod's
    init takes them. `comm` (an MPI communicator in Horovod) has no meaning here.
    """
    if comm is not None:
        raise ValueError("comm= is not supported: tf_bps jobs are described by DMLC_* "
                         "variables or started by bpslaunch, not by MPI")
    heap.keep_top_pad()
    _join()
    for process_set in process_sets or ():
        process_sets_module.add_process_set(process_set)


def _join(lost_server: str | None = None) -> None:
    global _job, _cluster_helpers, _metrics_port
    with _lock:
        if _job is not None:
            return
        config = Config.from_env()
        if config.cluster is not None and config.role == "server":
            # A TF_CONFIG ps task running the training script: it becomes the server,
            # serves until the job ends and exits, as TensorFlow's ps tasks do in
            # server.join().
            _become_server()
        if config.cluster is not None and _cluster_helpers is None:
            # Once per process: an elastic job's re-forms join again, to the same ones.
            _cluster_helpers = _start_cluster_helpers(config.cluster)
        if config.role not in (None, "worker"):
            raise RuntimeError(f"bps.init() runs in workers, but DMLC_ROLE={config.role!r}")
        configure_logging(config, f"tf_bps worker {config.rank}")
        core.set_logging(config, f"tf_bps worker {config.rank}")
        if config.metrics_port is not None and _metrics_port is None:
            # Before joining: a port it cannot have fails init.
            _metrics_port = metrics.serve(config, metrics.WorkerCollector(_rank_and_size),
                                          "worker")
        if not config.distributed:
            core.worker_init_local()
            _job = _Job(config, rank=0, size=1, local_rank=0, local_size=1, link=None)
        else:
            link = SchedulerLink(config)
            pipe = None
            try:
                extra = {"lost_server": lost_server} if lost_server else {}
                if config.elastic_worker_name:
                    extra["name"] = config.elastic_worker_name
                moves = core.moves_lost_servers(config)
                book = link.register("worker", worker_id=config.worker_id,
                                     local_rank=config.local_rank, local_size=config.local_size,
                                     local_merge=config.local_merge if config.enable_ipc else "0",
                                     moves_lost_servers=moves, **extra)
                # Heartbeats and the job's abort from here on: connecting to the servers
                # may take a while, and an abort must stop it. The core's lost servers
                # reach the scheduler through the same thread.
                pipe = _lost_server_pipe() if moves else None
                watch = (pipe[0], _lost_server_reports(book["servers"])) if pipe else None
                link.start_monitor(on_abort=_on_abort, on_notice=_on_notice, watch=watch)
                generation = int(book.get("generation", 0))
                if book["rank"] != config.rank:  # An elastic job numbered it anew.
                    configure_logging(config, f"tf_bps worker {book['rank']}")
                    core.set_logging(config, f"tf_bps worker {book['rank']}")
                core.worker_init(book["rank"], book["size"], book["servers"],
                                 book["merge_with"], book["workers"], config, generation,
                                 notify_fd=pipe[1] if pipe else -1)
            except BaseException as error:
                link.close(failure=f"worker could not start: {error}")
                if pipe:
                    core.worker_shutdown()
                    _close_pipe(pipe)
                raise
            _job = _Job(config, rank=book["rank"], size=book["size"],
                        local_rank=book["local_rank"], local_size=book["local_size"], link=link,
                        worker_hosts=tuple(book["workers"]), generation=generation,
                        servers=tuple(book["servers"]), lost_server_pipe=pipe)
            timeline = _timeline_path(config, _job.rank, _job.local_rank)
            if timeline:
                os.makedirs(os.path.dirname(timeline) or ".", exist_ok=True)
                core.worker_start_timeline(timeline, config.trace_start_step,
                                           config.trace_end_step)
            log.info("worker rank %d of %d joined%s; servers %s", _job.rank, _job.size,
                     f" generation {generation}" if generation else "", book["servers"])
        process_sets_module._reset(_job.rank, _job.size)
        if _job.local_size > 1:
            _pin_gpu(_job.local_rank)
    atexit.unregister(shutdown)  # Once, however often an elastic job re-forms.
    atexit.register(shutdown)
    _call_each(_generation_listeners)


def _call_each(listeners: list, *args) -> None:
    """Calls the live ones of `listeners` (weak methods) and forgets the dead."""
    listeners[:] = [ref for ref in listeners if ref() is not None]
    for ref in list(listeners):
        listener = ref()
        if listener is not None:
            listener(*args)


def _rank_and_size() -> tuple[int, int]:
    """This worker's place in the job now (-1 and 0 between two generations)."""
    job = _job
    return (job.rank, job.size) if job else (-1, 0)


def _timeline_path(config: Config, rank: int, local_rank: int) -> str | None:
    """Where this worker records its timeline: HOROVOD_TIMELINE (horovodrun's
    --timeline-filename) on rank 0, as Horovod does; BYTEPS_TRACE_DIR/<local rank>/
    comm.json on every worker with BYTEPS_TRACE_ON, as BytePS does."""
    if config.timeline_file and rank == 0:
        return config.timeline_file
    if config.trace_on:
        return os.path.join(config.trace_dir, str(local_rank), "comm.json")
    return None


# What start_timeline has said already: each note once per process, not once per call.
_timeline_notes: set[str] = set()


def _timeline_note(key: str, level: int, message: str, *args) -> None:
    if key not in _timeline_notes:
        _timeline_notes.add(key)
        log.log(level, message, *args)


def start_timeline(file_path, mark_cycles=False) -> None:
    """Horovod's start_timeline: records every collective operation this worker starts
    from now on into the file `file_path`, as Chrome trace events (chrome://tracing,
    Perfetto), as BYTEPS_TRACE_ON does for its window of steps: each operation's whole
    time ("total") and each stage of each of its partitions (REDUCE, QUEUE, PUSH, PULL,
    BROADCAST), named Comm.<tensor name>, with its step. stop_timeline() ends it.
    Starting again while recording switches files, as in Horovod: the new file takes
    every operation from now on, and this returns once the old one is written.

    Every worker records its own operations, so give each rank its own path (Horovod
    writes rank 0's alone; workers of a host given one path leave one whole timeline,
    the last written). Events stay in memory until the file is written: record some
    steps, not a whole run. A recording ends with the worker's core (shutdown, or an
    elastic job re-forming: its file is written then). `mark_cycles` is accepted for
    Horovod scripts; tf_bps has no negotiation cycles to mark.
    """
    job = _current()
    if not isinstance(mark_cycles, bool):
        raise ValueError(f"start_timeline: mark_cycles must be True or False, not "
                         f"{mark_cycles!r}")
    path = _timeline_file(file_path)
    if mark_cycles:
        _timeline_note("cycles", logging.INFO, "start_timeline: mark_cycles has nothing to "
                       "mark: tf_bps has no negotiation cycles (each operation goes to the "
                       "servers as it comes)")
    if job.link is None:
        # The local path runs each collective in place, with no stages to record.
        _timeline_note("local", logging.WARNING, "start_timeline: a single worker without "
                       "servers has no communication to record; %s is not written", path)
        return
    core.worker_start_timeline(path)


def _timeline_file(file_path) -> str:
    """`file_path` made absolute (the file is written later, on a thread of the core,
    whatever the script's working folder is by then), once it is known to be writable:
    a mistake is told now, not as a warning in the log once the recording is over."""
    path = os.fspath(file_path) if isinstance(file_path, (str, os.PathLike)) else None
    if not isinstance(path, str) or not path:
        raise ValueError(f"start_timeline: file_path must name a file, not {file_path!r}")
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise ValueError(f"start_timeline: cannot record into {file_path!r}: its folder "
                         f"{folder!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"start_timeline: cannot record into {file_path!r}: it is a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"start_timeline: cannot record into {file_path!r}: its folder "
                         f"{folder!r} is not writable")
    return path


def stop_timeline() -> None:
    """Horovod's stop_timeline: ends the recording start_timeline began, and returns
    once its file is written, that is once the operations it took have ended (at most
    BYTEPS_OP_TIMEOUT later: then the core warns, and the file follows when they end).
    Not recording: nothing to do, as in Horovod."""
    _current()
    core.worker_stop_timeline()


def _may_have_gpus() -> bool:
    """Whether an NVIDIA driver shows devices here: where none does, a worker that does
    not use TensorFlow never pays for importing it just to find no GPU."""
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/proc/driver/nvidia/gpus/*"))


def _pin_gpu(local_rank: int) -> None:
    """With several workers on a host, each uses the GPU of its local rank, as BytePS
    arranges (a script that pins one itself, Horovod-style, chooses the same). One
    worker per host keeps every GPU, for a tf.distribute strategy."""
    if "tensorflow" not in sys.modules and not _may_have_gpus():
        return
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) < 2:
        return
    try:
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    except RuntimeError:
        log.info("GPUs are already initialised; the script chose its own")


def _on_abort(reason: str) -> None:
    print(f"tf_bps: the job is failing: {reason}", file=sys.stderr, flush=True)
    core.worker_abort(f"the job is failing: {reason}")


def _lost_server_pipe() -> tuple[int, int]:
    """A pipe the core writes a byte to whenever a server is lost (never blocking)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    return read_end, write_end


def _close_pipe(pipe: tuple[int, int] | None) -> None:
    """After the core and the link: neither uses the pipe any more."""
    for fd in pipe or ():
        os.close(fd)


def _lost_server_reports(servers: list[str]):
    """The scheduler messages naming the servers the core lost since the last call."""
    reported = 0

    def reports() -> list[dict]:
        nonlocal reported
        lost = core.worker_lost_servers()
        fresh, reported = lost[reported:], len(lost)
        return [{"type": "server_lost", "server": servers[i]} for i in fresh
                if 0 <= i < len(servers)]

    return reports


def _on_notice(message: dict) -> None:
    if message["type"] == "reform":
        # This generation is over: what is in flight fails now, and elastic.run
        # re-forms (reform()).
        core.worker_abort(f"the job is re-forming: {message.get('reason')}")
        return
    if message["type"] == "server_gone":
        _move_lost_servers(message)
        return
    if message.get("leaving"):
        global _let_go
        _let_go = str(message["leaving"])[:300]
    _call_each(_host_listeners, float(message.get("timestamp", 0)), bool(message.get("added")))


def _move_lost_servers(message: dict) -> None:
    """The job goes on without these servers: their partitions move to the others."""
    job = _job
    gone = message.get("servers")
    if job is None or not isinstance(gone, list):
        return
    for address in gone:
        if address in job.servers:
            try:
                core.worker_move_lost_server(job.servers.index(address))
            except RuntimeError as error:
                core.worker_abort(f"the job lost server {address} ({message.get('reason')}) "
                                  f"and this worker cannot go on without it: {error}")
                return


def tell_scheduler(message: dict) -> None:
    """Sends `message` to the job's scheduler (a preemption notice, say)."""
    job = _current()
    if job.link is None:
        raise RuntimeError("a job of one process has no scheduler to tell")
    job.link.tell(message)


def add_host_listener(listener) -> None:
    """`listener(timestamp, added)`, a bound method, hears each change of the job's
    hosts for as long as its object lives."""
    _host_listeners.append(weakref.WeakMethod(listener))


def add_generation_listener(listener) -> None:
    """`listener()`, a bound method, is called each time this worker has joined a new
    generation of the job, for as long as its object lives: the servers of a new
    generation start with nothing of the last one's."""
    _generation_listeners.append(weakref.WeakMethod(listener))


def let_go_reason() -> str | None:
    """Why the scheduler let this worker go at its next commit, or None."""
    return _let_go


def reform() -> None:
    """Leaves this generation of an elastic job and registers for the next: the
    scheduler numbers the workers anew (survivors keep their order). Collectives in
    flight have failed; the caller restores or syncs its state afterwards. A server
    that went away without a word is named to the scheduler, which then need not wait
    for its silence to know."""
    lost = core.worker_lost_servers()
    job = _leave("re-form")
    _join(lost_server=job.servers[lost[0]] if lost and lost[0] < len(job.servers) else None)


def suspend() -> None:
    """BytePS's suspend: leaves the job's current generation (what is in flight fails)
    until resume(); an elastic job's scheduler re-forms the job when this worker comes
    back, or without it once it has been silent for PS_HEARTBEAT_TIMEOUT."""
    global _suspended
    _suspended = _leave("suspend")


def resume(num_workers: int, num_servers: int, global_rank: int | None = None) -> None:
    """BytePS's resume: joins the job again after suspend(), as the scheduler numbers
    it (survivors keep their order). The sizes given must be the re-formed job's, and
    `global_rank`, when given, this worker's new rank: a script that shards its data by
    its own numbers must not go on with others' ranks."""
    global _suspended
    if _suspended is None:
        raise RuntimeError("bps.resume() comes after bps.suspend()")
    _suspended = None
    _join()
    job = _current()
    servers = len(job.servers)
    if (job.size, servers) != (num_workers, num_servers) or \
            global_rank not in (None, job.rank):
        raise ValueError(
            f"the job re-formed as {job.size} worker(s) and {servers} server(s), this worker "
            f"rank {job.rank}; resume() was told {num_workers} worker(s), {num_servers} "
            f"server(s)" + (f" and rank {global_rank}" if global_rank is not None else ""))


def _leave(why: str) -> _Job:
    """Leaves the current generation of an elastic job without saying done: the
    scheduler knows when this worker registers again."""
    global _job
    with _lock:
        job, _job = _job, None
    if job is None or job.link is None or not job.config.elastic:
        if job is not None:
            _job = job
        raise RuntimeError(f"only a distributed job started with BYTEPS_ELASTIC=1 can {why} "
                           "(bpslaunch --min-np sets it)")
    process_sets_module._reset(None, 0)
    # The link first: its monitor may still pass on a reform, which must reach this
    # generation's core, not the next one's.
    job.link.close(say_done=False)
    core.worker_shutdown()
    _close_pipe(job.lost_server_pipe)
    return job


def shutdown() -> None:
    """Leaves the job: servers and the scheduler learn this worker is done."""
    _finish(failure=None)


def leave_failed(reason: str) -> None:
    """Leaves the job as failed, for a host process in which training raised (an engine's
    worker that outlives its training function): the scheduler ends the other workers
    with `reason` at once, instead of their waiting out BYTEPS_OP_TIMEOUT for this one."""
    _finish(failure=reason)


def _finish(failure: str | None) -> None:
    global _job
    with _lock:
        job, _job = _job, None
    if job is None:
        return
    process_sets_module._reset(None, 0)
    failure = failure or core.worker_failure()
    core.worker_shutdown()
    if job.link is not None:
        job.link.close(failure=failure or None)
    _close_pipe(job.lost_server_pipe)


def declare(names) -> None:
    """Gives the tensors `names` their scheduling priority in this order (earlier goes
    first) before their first use; names already used keep theirs."""
    job = _current()
    names = tuple(names)
    if job.link is None or names in job.declared:
        return
    core.worker_declare(list(names))
    job.declared.add(names)


def _current() -> _Job:
    job = _job
    if job is None:
        raise ValueError("tf_bps is not initialised: call bps.init() first")
    return job


def is_initialized() -> bool:
    return _job is not None


def config() -> Config:
    """The process's configuration: the one init() parsed, once; before init(), what
    the environment says now."""
    job = _job
    return job.config if job is not None else Config.from_env()


def is_distributed() -> bool:
    """Whether push_pull goes through servers (False on the single-worker local path)."""
    return _current().link is not None


def rank() -> int:
    return _current().rank


def size() -> int:
    return _current().size


def local_rank() -> int:
    """This process's index among the job's workers on this machine."""
    return _current().local_rank


def local_size() -> int:
    """How many of the job's workers run on this machine."""
    return _current().local_size


def cross_rank() -> int:
    """Index of this machine among the machines of the job (Horovod's cross_rank)."""
    job = _current()
    if not job.worker_hosts:
        return 0
    machines = list(dict.fromkeys(job.worker_hosts))  # In order of their first rank.
    return machines.index(job.worker_hosts[job.rank])


def cross_size() -> int:
    """How many machines the job's workers run on."""
    return len(set(_current().worker_hosts)) or 1


def worker_hosts() -> tuple[str, ...]:
    """The address each worker advertised, by rank (one entry on the local path)."""
    job = _current()
    return job.worker_hosts or (job.config.node_host or "localhost",)


def is_homogeneous() -> bool:
    """Whether every machine of the job runs the same number of workers."""
    hosts = _current().worker_hosts
    return len({hosts.count(host) for host in hosts}) <= 1


# What this build was made with, as Horovod scripts ask it (GPU pinning, for example).
# tf_bps synchronises through its own servers: no MPI, Gloo, NCCL, DDL, oneCCL, ROCm or
# SYCL is involved in this build; CUDA is where nvcc built the core's CUDA library.
def _not_in_this_build() -> bool:
    return False


def cuda_built() -> bool:
    """Whether GPU tensors go through the core's CUDA staging (tf_bps/_bps_gpu)."""
    return core.gpu_library() is not None


mpi_built = mpi_enabled = mpi_threads_supported = _not_in_this_build
gloo_built = gloo_enabled = ddl_built = ccl_built = _not_in_this_build
rocm_built = sycl_built = _not_in_this_build


def nccl_built() -> int:
    """Horovod answers with the NCCL version, 0 when built without it."""
    return 0
