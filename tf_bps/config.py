"""Every DMLC_*/BYTEPS_*/PS_* variable tf_bps reads, parsed and validated in one place.

Nothing else in tf_bps reads the environment for configuration: the C++ core gets
its settings from here through the C API.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from tf_bps.launch.cluster import ClusterError, Placement, placement

ROLES = ("scheduler", "server", "worker")
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
DEFAULT_PARTITION_BYTES = 4096000
# Below the 64 KiB floor of a partition (custom_ops/core/worker.cc) a tensor would be one
# small round of its own; such gradients share rounds instead.
DEFAULT_FUSION_THRESHOLD = 65536
DEFAULT_SCHEDULING_CREDIT = 2  # partitions per server in flight; measured in network_bound.py
# Upper bounds the code can honour: every wait in the core is an int of milliseconds.
MAX_TIMEOUT_SECONDS = 1_000_000
MAX_ENGINE_THREADS = 256
MAX_NODES = 4096  # workers or servers in one job
DEFAULT_MAX_TENSOR_BYTES = 2**36


class ConfigError(ValueError):
    """A variable has a value tf_bps cannot use; the message names it."""


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int = 0,
         maximum: int | None = None) -> int | None:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        accepted = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ConfigError(f"{name}={raw!r} is not valid: expected an integer {accepted}")
    return value


def visible_gpus(env: Mapping[str, str]) -> tuple[str, ...]:
    """The GPUs NVIDIA_VISIBLE_DEVICES (or else CUDA_VISIBLE_DEVICES) lists; none when
    unset or "none"/"void". "all" cannot be counted here and is refused."""
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        raw = env.get(name, "").strip()
        if not raw:
            continue
        if raw.lower() in ("none", "void", "-1"):
            return ()
        if raw.lower() == "all":
            raise ConfigError(f"{name}=all does not say how many GPUs there are: list them "
                              "(0,1,...) or set BYTEPS_LOCAL_SIZE")
        return tuple(item.strip() for item in raw.split(",") if item.strip())
    return ()


def _local_size(env: Mapping[str, str]) -> int:
    """BYTEPS_LOCAL_SIZE, or else one worker process per visible GPU, as BytePS's
    launcher does."""
    if env.get("BYTEPS_LOCAL_SIZE", "").strip():
        return _int(env, "BYTEPS_LOCAL_SIZE", 1, minimum=1, maximum=MAX_NODES)
    return max(1, len(visible_gpus(env)))


def _raw_float(env: Mapping[str, str], name: str) -> tuple[str, float] | None:
    """The variable as written and as a number (NaN where it is none); None if unset."""
    raw = env.get(name, "").strip()
    if raw == "":
        return None
    try:
        return raw, float(raw)
    except ValueError:
        return raw, math.nan


def _seconds(env: Mapping[str, str], name: str, default: float,
             maximum: float = MAX_TIMEOUT_SECONDS) -> float:
    given = _raw_float(env, name)
    if given is None:
        return default
    raw, value = given
    # Not `value <= 0`, which NaN would pass.
    if not 0 < value <= maximum:
        raise ConfigError(f"{name}={raw!r} is not valid: expected a number of seconds greater "
                          f"than 0 and at most {maximum:g}")
    return value


def read_cpu_list(text: str) -> set[int]:
    """The kernel's CPU list format, `0-3,8`; ValueError naming the part that is not."""
    cpus = set()
    for part in text.strip().split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or int(last or first) < int(first):
            raise ValueError(part)
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _cpu_lists(env: Mapping[str, str], name: str, sections: bool) -> tuple[frozenset, ...]:
    """A CPU list (or, with `sections`, colon-separated lists) in the variable `name`."""
    raw = env.get(name, "").strip()
    if not raw:
        return ()
    lists = []
    for section in raw.split(":") if sections else [raw]:
        try:
            lists.append(frozenset(read_cpu_list(section)))
        except ValueError as error:
            raise ConfigError(f"{name}={raw!r} is not valid: {str(error)!r} is not a CPU number "
                              "or range (expected lists such as 0,2-5" +
                              (", one per worker, separated by colons)" if sections else ")")
                              ) from None
    return tuple(lists)


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    if raw == "0":
        return False
    if raw == "1":
        return True
    raise ConfigError(f"{name}={raw!r} is not valid: expected 0 or 1")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str | None,
            upper: bool = False) -> str | None:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    value = raw.upper() if upper else raw
    if value not in choices:
        raise ConfigError(f"{name}={raw!r} is not valid: expected one of {', '.join(choices)}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float,
           maximum: float) -> float:
    given = _raw_float(env, name)
    if given is None:
        return default
    raw, value = given
    if not minimum <= value <= maximum:  # NaN fails too
        raise ConfigError(f"{name}={raw!r} is not valid: expected a number from {minimum:g} "
                          f"to {maximum:g}")
    return value


# Variables of BytePS and AIACC-Training that have no effect here, and why (README lists
# them); their values are still checked where they have a documented form.
WITHOUT_EFFECT = {
    "PERSEUS_MASTER_PORT": "the rendezvous port of PyTorch DDP launchers",
    "PERSEUS_USE_DDP_LAUNCHER": "a PyTorch DDP launcher switch",
    "PERSEUS_ALLREDUCE_MODE": "AIACC's choice of all-reduce algorithm; tf_bps always sums "
                              "through its servers",
    "PERSEUS_NCCL_NETWORK_INTERFACE": "the NCCL interface of AIACC's GPU path",
    "PERSEUS_OFFLINE_NEG": "AIACC's offline gradient negotiation; tf_bps matches tensors by "
                           "name, which needs none",
    "BYTEPS_PCIE_SWITCH_SIZE": "BytePS's GPU topology hint; this build has no GPU pipeline",
    "BYTEPS_NCCL_NUM_RINGS": "a NCCL tuning knob of BytePS's GPU pipeline",
    "BYTEPS_NCCL_GROUP_SIZE": "a NCCL tuning knob of BytePS's GPU pipeline",
    "BYTEPS_NCCL_HOME": "where BytePS builds NCCL from; tf_bps needs none to build",
}
# Variables whose feature tf_bps does not have: set to 1 they are refused, saying why.
_REFUSED = {
    "BYTEPS_SERVER_ENABLE_SCHEDULE": "servers sum partitions in arrival order; workers already "
                                     "send them in priority order within the scheduling credit",
    "PERSEUS_NCCL_ENABLE": "it needs AIACC's special build for RDMA and VPC links together",
}
# PERSEUS_ALLREDUCE_DTYPE: what gradients travel as.
WIRE_DTYPES = {"0": "float16", "1": "float32", "2": "mixed"}


@dataclass(frozen=True)
class Config:
    role: str | None
    root_uri: str | None
    root_port: int | None
    num_worker: int
    num_server: int
    worker_id: int
    local_rank: int
    local_size: int
    partition_bytes: int
    # BYTEPS_SCHEDULING_CREDIT: partitions a worker may have pushed to one server
    # without the sum back (custom_ops/core/credits.h); 0: no limit.
    scheduling_credit: int
    server_engine_threads: int
    force_distributed: bool
    # BYTEPS_ENABLE_ASYNC: servers keep the parameters and workers push weight deltas
    # without waiting for each other (training.py, custom_ops/core/protocol.h).
    enable_async: bool
    enable_ipc: bool
    # The workers of one host sum push_pull partitions among themselves before one of
    # them pushes (custom_ops/core/local_merge.h); it needs shared memory (IPC).
    local_merge: bool
    # Core affinity of the workers bpslaunch starts (launch/affinity.py): BYTEPS_NUMA_ON,
    # the physical cores per worker, CPUs to avoid, explicit lists per local worker,
    # and whether a worker gets every hyperthread of its cores.
    numa_on: bool
    numa_quota: int | None
    cpu_blacklist: frozenset
    visible_cpu_cores: tuple[frozenset, ...] | None
    multithreaded_cpu: bool
    # AIACC-Training's options (README, "AIACC-Training's variables"): a NaN or Inf in a
    # push_pull fails it; what gradients travel as (None: the compression argument
    # decides) and the scale applied before float16; local gradient accumulation;
    # fusion buffers (0: none); allgather's layout.
    nan_check: bool
    wire_dtype: str | None
    gradient_scale: float
    accumulate_steps: int
    fusion: int
    # Gradients under this many bytes travel fused, per dtype, in buffers of at most
    # one partition (fusion.py); 0: each alone.
    fusion_threshold: int
    # Down-sampling: one gradient element in N per step, the rest carried over with the
    # momentum (downsample.py); every N steps, slow workers reported (perf_check.py).
    downsample: int
    gradient_momentum: float
    perf_check_steps: int
    stacked_allgather: bool
    # The timeline (BYTEPS_TRACE_*): each worker writes <dir>/<local rank>/comm.json
    # for steps start to end (custom_ops/core/timeline.h).
    trace_on: bool
    trace_start_step: int
    trace_end_step: int
    trace_dir: str
    enable_gdb: bool  # bpslaunch runs each worker under gdb and prints its backtrace
    debug_sample_tensor: str  # a tensor name or id whose values workers log at each stage
    log_level: str
    ps_verbose: int
    node_host: str | None
    interface: str | None
    heartbeat_interval: float
    heartbeat_timeout: float
    op_timeout: float
    # Every node of a job proves it knows this (bpslaunch makes one per job); empty
    # when a job started role by role sets none, and then nothing is proven.
    job_token: str
    max_tensor_bytes: int  # the largest tensor a server accepts a declaration of
    listen_any: bool  # servers and the scheduler listen on every interface
    # Set when a cluster manager (mpirun, Slurm, TF_CONFIG) placed this process and
    # implied the DMLC_* variables the user did not set (launch/cluster.py).
    cluster: Placement | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        try:
            cluster = placement(env)
        except ClusterError as error:
            raise ConfigError(str(error)) from None
        if cluster is not None:
            env = {**cluster.variables, **env}
        if _flag(env, "DMLC_ENABLE_RDMA"):
            raise ConfigError(
                "DMLC_ENABLE_RDMA=1 is not supported: this build of tf_bps has the TCP "
                "transport only; set DMLC_ENABLE_RDMA=0 or leave it unset")
        config = cls(
            role=_choice(env, "DMLC_ROLE", ROLES, None),
            root_uri=env.get("DMLC_PS_ROOT_URI", "").strip() or None,
            root_port=_int(env, "DMLC_PS_ROOT_PORT", None, minimum=1, maximum=65535),
            num_worker=_int(env, "DMLC_NUM_WORKER", 1, minimum=1, maximum=MAX_NODES),
            num_server=_int(env, "DMLC_NUM_SERVER", 0, minimum=0, maximum=MAX_NODES),
            worker_id=_int(env, "DMLC_WORKER_ID", 0),
            local_rank=_int(env, "BYTEPS_LOCAL_RANK", 0),
            local_size=_local_size(env),
            partition_bytes=_int(env, "BYTEPS_PARTITION_BYTES", DEFAULT_PARTITION_BYTES,
                                 minimum=8, maximum=2**31 - 1),
            # AIACC's stream count bounds what is in flight, as the credit does.
            scheduling_credit=_int(env, "BYTEPS_SCHEDULING_CREDIT", _int(
                env, "PERSEUS_ALLREDUCE_STREAMS", DEFAULT_SCHEDULING_CREDIT, minimum=1,
                maximum=12), minimum=0, maximum=1024),
            server_engine_threads=_int(env, "BYTEPS_SERVER_ENGINE_THREAD", 4, minimum=1,
                                       maximum=MAX_ENGINE_THREADS),
            force_distributed=_flag(env, "BYTEPS_FORCE_DISTRIBUTED"),
            enable_async=_flag(env, "BYTEPS_ENABLE_ASYNC"),
            enable_ipc=_flag(env, "BYTEPS_ENABLE_IPC", default=True),
            local_merge=_flag(env, "BYTEPS_LOCAL_MERGE", default=True),
            numa_on=_flag(env, "BYTEPS_NUMA_ON", default=True),
            numa_quota=_int(env, "BYTEPS_NUMA_DEFAULT_QUOTA", None, minimum=1, maximum=1 << 20),
            cpu_blacklist=frozenset().union(*_cpu_lists(env, "BYTEPS_CPU_BLACKLIST", False)),
            visible_cpu_cores=_cpu_lists(env, "BYTEPS_VISIBLE_CPU_CORES", True) or None,
            multithreaded_cpu=_flag(env, "BYTEPS_MULTITHREADED_CPU", default=True),
            nan_check=_flag(env, "PERSEUS_ALLREDUCE_NANCHECK"),
            wire_dtype=WIRE_DTYPES.get(_choice(env, "PERSEUS_ALLREDUCE_DTYPE",
                                               tuple(WIRE_DTYPES), None)),
            gradient_scale=_float(env, "PERSEUS_ALLREDUCE_GRADIENT_SCALE", 10.0, 1e-6, 1e6),
            accumulate_steps=_int(env, "PERSEUS_ACCUMULATE_N_STEPS", 1, minimum=1,
                                  maximum=1 << 20),
            fusion=_int(env, "PERSEUS_ALLREDUCE_FUSION", 0, minimum=0, maximum=128),
            fusion_threshold=_int(env, "BYTEPS_FUSION_THRESHOLD", DEFAULT_FUSION_THRESHOLD,
                                  minimum=0, maximum=2**31 - 1),
            downsample=_int(env, "PERSEUS_DOWNSAMPLE_N_ELEMENTS", 1, minimum=1, maximum=1024),
            gradient_momentum=_float(env, "PERSEUS_GRADIENT_MOMENTUM", 1.0, 0.0, 1.0),
            perf_check_steps=_int(env, "PERSEUS_PERF_CHECK_N_STEPS", 0, minimum=0,
                                  maximum=1 << 30),
            stacked_allgather=_choice(env, "PERSEUS_CHANGE_HVD_ALLGATHER", ("0", "1"),
                                      "1") == "0",
            trace_on=_flag(env, "BYTEPS_TRACE_ON"),
            trace_start_step=_int(env, "BYTEPS_TRACE_START_STEP", 10, minimum=1,
                                  maximum=2**31 - 1),
            trace_end_step=_int(env, "BYTEPS_TRACE_END_STEP", 20, minimum=1, maximum=2**31 - 1),
            trace_dir=env.get("BYTEPS_TRACE_DIR", "").strip() or "./traces",
            enable_gdb=_flag(env, "BYTEPS_ENABLE_GDB"),
            debug_sample_tensor=env.get("BYTEPS_DEBUG_SAMPLE_TENSOR", "").strip(),
            log_level=_choice(env, "BYTEPS_LOG_LEVEL", LOG_LEVELS, "WARNING", upper=True),
            ps_verbose=int(_choice(env, "PS_VERBOSE", ("0", "1", "2"), "0")),
            node_host=env.get("DMLC_NODE_HOST", "").strip() or None,
            interface=(env.get("DMLC_INTERFACE", "").strip()
                       or env.get("PERSEUS_GLOO_NETWORK_INTERFACE", "").strip() or None),
            heartbeat_interval=_seconds(env, "PS_HEARTBEAT_INTERVAL", 1.0),
            heartbeat_timeout=_seconds(env, "PS_HEARTBEAT_TIMEOUT", 10.0),
            op_timeout=_seconds(env, "BYTEPS_OP_TIMEOUT",
                                _seconds(env, "GLOO_TIMEOUT_SECONDS", 300.0)),
            job_token=env.get("BYTEPS_JOB_TOKEN", ""),
            max_tensor_bytes=_int(env, "BYTEPS_MAX_TENSOR_BYTES", DEFAULT_MAX_TENSOR_BYTES,
                                  minimum=2**20, maximum=2**48),
            listen_any=_flag(env, "BYTEPS_LISTEN_ANY"),
            cluster=cluster,
        )
        if config.heartbeat_interval >= config.heartbeat_timeout:
            raise ConfigError(
                f"PS_HEARTBEAT_INTERVAL={config.heartbeat_interval:g} is not valid: it must be "
                f"shorter than PS_HEARTBEAT_TIMEOUT={config.heartbeat_timeout:g}, or every "
                "node would be declared dead between two heartbeats")
        for name, reason in _REFUSED.items():
            if _flag(env, name):
                raise ConfigError(f"{name}=1 is not supported: {reason}; set it to 0 or unset")
        _check_without_effect(env)
        if config.trace_end_step < config.trace_start_step:
            raise ConfigError(
                f"BYTEPS_TRACE_END_STEP={config.trace_end_step} is not valid: it comes before "
                f"BYTEPS_TRACE_START_STEP={config.trace_start_step}")
        if config.size > MAX_NODES:
            raise ConfigError(
                f"DMLC_NUM_WORKER={config.num_worker} x BYTEPS_LOCAL_SIZE={config.local_size} "
                f"is more than {MAX_NODES} worker processes")
        if config.worker_id >= config.num_worker:
            raise ConfigError(
                f"DMLC_WORKER_ID={config.worker_id} is not valid: expected 0 to "
                f"DMLC_NUM_WORKER-1 ({config.num_worker - 1})")
        if config.local_rank >= config.local_size:
            raise ConfigError(
                f"BYTEPS_LOCAL_RANK={config.local_rank} is not valid: expected 0 to "
                f"BYTEPS_LOCAL_SIZE-1 ({config.local_size - 1})")
        return config

    @property
    def credit_bytes(self) -> int:
        return self.scheduling_credit * self.partition_bytes

    @property
    def size(self) -> int:
        """Worker processes in the job: one per local rank on every worker machine."""
        return self.num_worker * self.local_size

    @property
    def rank(self) -> int:
        return self.worker_id * self.local_size + self.local_rank

    @property
    def distributed(self) -> bool:
        """Whether push_pull goes through servers (more than one worker, or forced)."""
        return self.size > 1 or self.force_distributed

    def require_rendezvous(self) -> tuple[str, int]:
        """The scheduler's address; raises naming whichever variable is missing."""
        missing = [name for name, value in (("DMLC_PS_ROOT_URI", self.root_uri),
                                            ("DMLC_PS_ROOT_PORT", self.root_port)) if not value]
        if missing:
            raise ConfigError(
                f"{' and '.join(missing)} must be set: a distributed job needs the scheduler's "
                "address (or start the job with bpslaunch)")
        if self.num_server < 1:
            raise ConfigError(
                "DMLC_NUM_SERVER must be set to at least 1: a distributed job needs servers")
        try:
            socket.getaddrinfo(self.root_uri, self.root_port, socket.AF_INET)
        except OSError as error:
            raise ConfigError(f"DMLC_PS_ROOT_URI={self.root_uri!r} is not valid: it does not "
                              f"resolve to an IPv4 address ({error})") from None
        return self.root_uri, self.root_port

    def core_log_level(self) -> int:
        """The core's level (0 trace .. 4 error): the more verbose of the two variables."""
        level = {"TRACE": 0, "DEBUG": 1, "INFO": 2, "WARNING": 3, "ERROR": 4, "FATAL": 4}[
            self.log_level]
        verbose = {0: 4, 1: 2, 2: 0}[self.ps_verbose]
        return min(level, verbose)

    def gradient_step_options(self) -> list[str]:
        """The AIACC options that work on each step's synchronised gradients
        (downsample.py, perf_check.py), as NAME=value, for those that are set."""
        return [f"{name}={value}" for name, value, neutral in (
            ("PERSEUS_DOWNSAMPLE_N_ELEMENTS", self.downsample, 1),
            ("PERSEUS_PERF_CHECK_N_STEPS", self.perf_check_steps, 0)) if value != neutral]

    def listen_host(self) -> str:
        """Where this node listens: its advertised address when it is one of this
        machine's (so strangers on other interfaces see no port), else everywhere
        (behind NAT, say)."""
        if self.listen_any:
            return ""
        host = self.advertised_host()
        return host if is_local_address(host) else ""

    def advertised_host(self) -> str:
        """The address other nodes use to reach this one."""
        if self.node_host:
            return self.node_host
        if self.interface:
            return _interface_address(self.interface)
        root_uri, root_port = self.require_rendezvous()
        # Connecting a UDP socket sends nothing; it only asks the kernel for the route.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((root_uri, root_port))
            return probe.getsockname()[0]


def _check_without_effect(env: Mapping[str, str]) -> None:
    """The variables that change nothing here must still be well formed."""
    _int(env, "PERSEUS_MASTER_PORT", None, minimum=1, maximum=65535)
    for name in ("PERSEUS_USE_DDP_LAUNCHER", "PERSEUS_OFFLINE_NEG"):
        _flag(env, name)
    for name in ("BYTEPS_PCIE_SWITCH_SIZE", "BYTEPS_NCCL_NUM_RINGS", "BYTEPS_NCCL_GROUP_SIZE"):
        _int(env, name, None, minimum=1, maximum=1 << 20)


def is_local_address(host: str) -> bool:
    """Whether `host` is an address of this machine (binding to it succeeds only then)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
        return True
    except OSError:
        return False


def _interface_address(name: str) -> str:
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), siocgifaddr,
                                 struct.pack("256s", name[:15].encode()))
        except OSError as error:
            raise ConfigError(
                f"DMLC_INTERFACE={name!r} is not valid: no IPv4 address on that interface "
                f"({error.strerror})") from None
    return socket.inet_ntoa(packed[20:24])


def configure_logging(config: Config, prefix: str) -> logging.Logger:
    """Sets up the "tf_bps" logger (and only it) for this process: BYTEPS_LOG_LEVEL, one
    stderr handler with `prefix`, no propagation. The root logger stays the user's, so
    their `logging.basicConfig` keeps working and our lines are never printed twice."""
    logger = logging.getLogger("tf_bps")
    logger.setLevel("DEBUG" if config.log_level == "TRACE" else config.log_level)
    logger.propagate = False
    for handler in [h for h in logger.handlers if getattr(h, "_tf_bps", False)]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler()
    handler._tf_bps = True
    handler.setFormatter(logging.Formatter(f"[{prefix} %(levelname)s] %(message)s"))
    logger.addHandler(handler)
    return logger
