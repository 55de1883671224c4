"""Every DMLC_*/BYTEPS_*/PS_* variable tf_bps reads, parsed and validated in one place.

Nothing else in tf_bps reads the environment for configuration: the C++ core gets
its settings from here through the C API.
"""

from __future__ import annotations

import ast
import fcntl
import logging
import math
import os
import re
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tf_bps.runtime.cluster_env import ClusterError, Placement, placement


class ConfigError(ValueError):
    """A variable has a value tf_bps cannot use; the message names it."""


@dataclass(frozen=True)
class Setting:
    """One entry of settings.def: a variable's kind, default and accepted values."""
    kind: str  # INT, NUMBER, SECONDS, FLAG, REFUSED, CHOICE or TEXT
    name: str
    default: object  # parsed: None where the table says "" for a number or choice
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    any_case: bool = False
    reason: str = ""  # REFUSED: why 1 is refused


def _read_settings() -> dict[str, Setting]:
    """The table the native code compiles in too: custom_ops/control/settings.def, which
    this package links to (or, installed, holds a copy of)."""
    table = {}
    text = Path(__file__).with_name("settings.def").read_text()
    for line in text.splitlines():
        if not line.startswith("BPS_"):
            continue  # comments and blank lines
        match = re.fullmatch(r"BPS_([A-Z]+)\((.*)\)", line.strip())
        if not match:
            raise ValueError(f"settings.def: one entry per line, nothing after it: {line!r}")
        kind, args = match[1], ast.literal_eval(f"({match[2]},)")
        name = args[0]
        if kind in ("INT", "NUMBER"):
            cast = int if kind == "INT" else float
            setting = Setting(kind, name, cast(args[1]) if args[1] else None, args[2], args[3])
        elif kind == "SECONDS":
            setting = Setting(kind, name, float(args[1]) if args[1] else None, 0, args[2])
        elif kind == "FLAG":
            setting = Setting(kind, name, bool(args[1]))
        elif kind == "REFUSED":
            setting = Setting(kind, name, False, reason=args[1])
        elif kind == "CHOICE":
            setting = Setting(kind, name, args[1] or None, choices=tuple(args[2].split("|")),
                              any_case=bool(args[3]))
        elif kind == "TEXT":
            setting = Setting(kind, name, args[1])
        else:
            raise ValueError(f"settings.def: unknown kind BPS_{kind} in {line!r}")
        table[name] = setting
    return table


SETTINGS = _read_settings()
LOG_LEVELS = SETTINGS["BYTEPS_LOG_LEVEL"].choices
_TABLE_DEFAULT = object()  # "the default settings.def gives"


def _default(name: str, default: object) -> object:
    return SETTINGS[name].default if default is _TABLE_DEFAULT else default


def _int(env: Mapping[str, str], name: str, default: object = _TABLE_DEFAULT) -> int | None:
    setting = SETTINGS[name]
    raw = env.get(name, "").strip()
    if raw == "":
        return _default(name, default)
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not setting.minimum <= value <= setting.maximum:
        raise ConfigError(f"{name}={raw!r} is not valid: expected an integer from "
                          f"{setting.minimum} to {setting.maximum}")
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


def _flag(env: Mapping[str, str], name: str, default: object = _TABLE_DEFAULT) -> bool:
    raw = env.get(name, "").strip()
    if raw == "":
        return _default(name, default)
    if raw not in ("0", "1"):
        raise ConfigError(f"{name}={raw!r} is not valid: expected 0 or 1")
    return raw == "1"


def _choice(env: Mapping[str, str], name: str) -> str | None:
    setting = SETTINGS[name]
    raw = env.get(name, "").strip()
    if raw == "":
        return setting.default
    value = raw.upper() if setting.any_case else raw
    if value not in setting.choices:
        raise ConfigError(f"{name}={raw!r} is not valid: expected one of "
                          f"{', '.join(setting.choices)}")
    return value


def _number(env: Mapping[str, str], name: str, default: object = _TABLE_DEFAULT) -> float:
    """A NUMBER, or SECONDS (which must be above 0)."""
    setting = SETTINGS[name]
    raw = env.get(name, "").strip()
    if raw == "":
        return _default(name, default)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    low, high = setting.minimum, setting.maximum
    if setting.kind == "SECONDS":
        if not low < value <= high:  # Not `value <= 0`, which NaN would pass.
            raise ConfigError(f"{name}={raw!r} is not valid: expected a number of seconds "
                              f"greater than 0 and at most {high:g}")
    elif not low <= value <= high:  # NaN fails too
        raise ConfigError(f"{name}={raw!r} is not valid: expected a number from {low:g} "
                          f"to {high:g}")
    return value


def _text(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip() or SETTINGS[name].default


def _uids(env: Mapping[str, str], name: str) -> tuple[int, ...]:
    """A comma-separated list of user ids (custom_ops/control/settings.cc reads it alike)."""
    uids = []
    for part in filter(None, (p.strip() for p in _text(env, name).split(","))):
        if not part.isdigit() or int(part) >= 2**32 - 1:
            raise ConfigError(f"{name}={env[name]!r} is not valid: expected user ids (numbers "
                              "0 to 4294967294) separated by commas")
        uids.append(int(part))
    return tuple(uids)


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


def _check_table(env: Mapping[str, str]) -> None:
    """Every variable of settings.def must be well formed, whether this process uses
    it or not (the native server checks the same), and none refused may be 1."""
    readers = {"INT": _int, "NUMBER": _number, "SECONDS": _number, "FLAG": _flag,
               "REFUSED": _flag, "CHOICE": _choice, "TEXT": _text}
    for name, setting in SETTINGS.items():
        if readers[setting.kind](env, name) is True and setting.kind == "REFUSED":
            raise ConfigError(f"{name}=1 is not supported: {setting.reason}; set it to 0 or "
                              "unset")


def table_entries(env: Mapping[str, str]) -> tuple[str, ...]:
    """NAME=value for each variable of settings.def that `env` sets, and for the GPU
    lists the table's rules read (visible_gpus), as this module reads them."""
    names = [*SETTINGS, "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]
    return tuple(f"{name}={env[name].strip()}" for name in names
                 if env.get(name, "").strip())


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
    "BYTEPS_PCIE_SWITCH_SIZE": "BytePS's GPU topology hint for its NCCL merge, which this "
                               "build does not have yet",
    "BYTEPS_NCCL_NUM_RINGS": "a NCCL tuning knob of BytePS's GPU pipeline",
    "BYTEPS_NCCL_GROUP_SIZE": "a NCCL tuning knob of BytePS's GPU pipeline",
    "BYTEPS_NCCL_HOME": "where BytePS builds NCCL from; only the Bazel build looks there, "
                        "and nothing in tf_bps uses NCCL yet",
}
# PERSEUS_ALLREDUCE_DTYPE: what gradients travel as.
ENCRYPT_WITHOUT_TOKEN = (
    "BYTEPS_ENCRYPT=1 needs BYTEPS_JOB_TOKEN: the keys are derived from the job's token "
    "(bpslaunch makes one; set it yourself when you start the roles one by one)")
# A token shorter than this can be found by trying guesses against one recorded
# registration (its proof is an HMAC under the token), away from the job.
MIN_TOKEN_CHARS = 16


def short_token_error(length: int) -> str:
    return (f"BYTEPS_JOB_TOKEN has {length} character(s): it needs at least {MIN_TOKEN_CHARS}, "
            "because anyone who sees one registration on the network can try guesses of a "
            "short token against it offline; use a longer one (bpslaunch makes 32), or set "
            "BYTEPS_ALLOW_SHORT_TOKEN=1 to accept it anyway")


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
    # BYTEPS_MIN_COMPRESS_BYTES: push_pulls smaller than this travel uncompressed even
    # when a compressor is asked for (custom_ops/compression/compressor.h).
    min_compress_bytes: int
    # BYTEPS_SCHEDULING_CREDIT: partitions a worker may have pushed to one server
    # without the sum back (custom_ops/worker/credits.h); 0: no limit.
    scheduling_credit: int
    server_engine_threads: int
    force_distributed: bool
    # BYTEPS_ENABLE_ASYNC: servers keep the parameters and workers push weight deltas
    # without waiting for each other (training/asynchronous.py, custom_ops/wire/protocol.h).
    enable_async: bool
    enable_ipc: bool
    # The workers of one host sum push_pull partitions among themselves before one of
    # them pushes (custom_ops/worker/local_merge.h); it needs shared memory (IPC). "auto":
    # where a server is on another host, so that it saves bytes on a network link
    # (the scheduler decides, scheduler.py); "1": always; "0": never.
    local_merge: str
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
    # for steps start to end (custom_ops/worker/timeline.h).
    trace_on: bool
    trace_start_step: int
    trace_end_step: int
    trace_dir: str
    timeline_file: str  # HOROVOD_TIMELINE: rank 0's timeline goes here instead
    enable_gdb: bool  # bpslaunch runs each worker under gdb and prints its backtrace
    debug_sample_tensor: str  # a tensor name or id whose values workers log at each stage
    # BYTEPS_METRICS_PORT: this process's Prometheus endpoint (metrics.py); None: none,
    # 0: any free port.
    metrics_port: int | None
    log_level: str
    ps_verbose: int
    node_host: str | None
    interface: str | None
    heartbeat_interval: float
    heartbeat_timeout: float
    op_timeout: float
    # How long a node waits for the job to form (every node registered), and the
    # variable that said so: HOROVOD_START_TIMEOUT (--start-timeout), else the above.
    start_timeout: float
    start_timeout_variable: str
    # Elastic training (BYTEPS_ELASTIC): a lost or added worker re-forms the job, which
    # ends only with fewer than `elastic_min_workers` left for `elastic_timeout` s.
    elastic: bool
    elastic_min_workers: int
    elastic_max_workers: int | None  # None: no bound on workers asking to join
    elastic_timeout: float
    elastic_reset_limit: int | None  # re-formings allowed; None: any number
    # What the elastic launcher calls this worker, to ask the scheduler to let it go.
    elastic_worker_name: str
    # Every node of a job proves it knows this (bpslaunch makes one per job); empty
    # when a job started role by role sets none, and then nothing is proven.
    job_token: str
    # BYTEPS_ENCRYPT: every frame between workers and servers is encrypted and
    # authenticated with keys derived from the token (custom_ops/wire/crypto.h).
    encrypt: bool
    # Uids besides our own that may reach this process over a local socket.
    local_uids: tuple[int, ...]
    max_tensor_bytes: int  # the largest tensor a server accepts a declaration of
    listen_any: bool  # servers and the scheduler listen on every interface
    # Set when a cluster manager (mpirun, Slurm, TF_CONFIG) placed this process and
    # implied the DMLC_* variables the user did not set (cluster_env.py).
    cluster: Placement | None = None
    # The variables of settings.def this process's environment sets, as read here
    # ("NAME=value" each), and the GPU lists the table's rules read: the worker's core
    # reads its variables from these (custom_ops/worker/c_api.h), not the environment.
    settings: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        try:
            cluster = placement(env)
        except ClusterError as error:
            raise ConfigError(str(error)) from None
        if cluster is not None:
            env = {**cluster.variables, **env}
        _check_table(env)
        token = _text(env, "BYTEPS_JOB_TOKEN")
        if 0 < len(token) < MIN_TOKEN_CHARS and not _flag(env, "BYTEPS_ALLOW_SHORT_TOKEN"):
            raise ConfigError(short_token_error(len(token)))
        local_size = _int(env, "BYTEPS_LOCAL_SIZE", None)
        # AIACC's stream count bounds what is in flight, as the credit does.
        credit = _int(env, "BYTEPS_SCHEDULING_CREDIT", _int(env, "PERSEUS_ALLREDUCE_STREAMS"))
        op_timeout = _number(env, "BYTEPS_OP_TIMEOUT", _number(env, "GLOO_TIMEOUT_SECONDS"))
        config = cls(
            role=_choice(env, "DMLC_ROLE"),
            root_uri=_text(env, "DMLC_PS_ROOT_URI") or None,
            root_port=_int(env, "DMLC_PS_ROOT_PORT"),
            num_worker=_int(env, "DMLC_NUM_WORKER"),
            num_server=_int(env, "DMLC_NUM_SERVER"),
            worker_id=_int(env, "DMLC_WORKER_ID"),
            local_rank=_int(env, "BYTEPS_LOCAL_RANK"),
            # Unset: one worker process per visible GPU, as BytePS's launcher does.
            local_size=local_size or max(1, len(visible_gpus(env))),
            partition_bytes=_int(env, "BYTEPS_PARTITION_BYTES"),
            min_compress_bytes=_int(env, "BYTEPS_MIN_COMPRESS_BYTES"),
            scheduling_credit=credit,
            server_engine_threads=_int(env, "BYTEPS_SERVER_ENGINE_THREAD"),
            force_distributed=_flag(env, "BYTEPS_FORCE_DISTRIBUTED"),
            enable_async=_flag(env, "BYTEPS_ENABLE_ASYNC"),
            enable_ipc=_flag(env, "BYTEPS_ENABLE_IPC"),
            local_merge=_choice(env, "BYTEPS_LOCAL_MERGE"),
            numa_on=_flag(env, "BYTEPS_NUMA_ON"),
            numa_quota=_int(env, "BYTEPS_NUMA_DEFAULT_QUOTA"),
            cpu_blacklist=frozenset().union(*_cpu_lists(env, "BYTEPS_CPU_BLACKLIST", False)),
            visible_cpu_cores=_cpu_lists(env, "BYTEPS_VISIBLE_CPU_CORES", True) or None,
            multithreaded_cpu=_flag(env, "BYTEPS_MULTITHREADED_CPU"),
            nan_check=_flag(env, "PERSEUS_ALLREDUCE_NANCHECK"),
            wire_dtype=WIRE_DTYPES.get(_choice(env, "PERSEUS_ALLREDUCE_DTYPE")),
            gradient_scale=_number(env, "PERSEUS_ALLREDUCE_GRADIENT_SCALE"),
            accumulate_steps=_int(env, "PERSEUS_ACCUMULATE_N_STEPS"),
            fusion=_int(env, "PERSEUS_ALLREDUCE_FUSION"),
            fusion_threshold=_int(env, "BYTEPS_FUSION_THRESHOLD"),
            downsample=_int(env, "PERSEUS_DOWNSAMPLE_N_ELEMENTS"),
            gradient_momentum=_number(env, "PERSEUS_GRADIENT_MOMENTUM"),
            perf_check_steps=_int(env, "PERSEUS_PERF_CHECK_N_STEPS"),
            stacked_allgather=_choice(env, "PERSEUS_CHANGE_HVD_ALLGATHER") == "0",
            trace_on=_flag(env, "BYTEPS_TRACE_ON"),
            trace_start_step=_int(env, "BYTEPS_TRACE_START_STEP"),
            trace_end_step=_int(env, "BYTEPS_TRACE_END_STEP"),
            trace_dir=_text(env, "BYTEPS_TRACE_DIR"),
            timeline_file=_text(env, "HOROVOD_TIMELINE"),
            enable_gdb=_flag(env, "BYTEPS_ENABLE_GDB"),
            debug_sample_tensor=_text(env, "BYTEPS_DEBUG_SAMPLE_TENSOR"),
            metrics_port=_int(env, "BYTEPS_METRICS_PORT"),
            log_level=_choice(env, "BYTEPS_LOG_LEVEL"),
            ps_verbose=int(_choice(env, "PS_VERBOSE")),
            node_host=_text(env, "DMLC_NODE_HOST") or None,
            interface=(_text(env, "DMLC_INTERFACE")
                       or _text(env, "PERSEUS_GLOO_NETWORK_INTERFACE") or None),
            heartbeat_interval=_number(env, "PS_HEARTBEAT_INTERVAL"),
            heartbeat_timeout=_number(env, "PS_HEARTBEAT_TIMEOUT"),
            op_timeout=op_timeout,
            start_timeout=_number(env, "HOROVOD_START_TIMEOUT", op_timeout),
            start_timeout_variable=("HOROVOD_START_TIMEOUT"
                                    if env.get("HOROVOD_START_TIMEOUT", "").strip()
                                    else "BYTEPS_OP_TIMEOUT"),
            elastic=_flag(env, "BYTEPS_ELASTIC"),
            elastic_min_workers=_int(env, "BYTEPS_ELASTIC_MIN_WORKERS"),
            elastic_max_workers=_int(env, "BYTEPS_ELASTIC_MAX_WORKERS", None),
            elastic_timeout=_number(env, "BYTEPS_ELASTIC_TIMEOUT"),
            elastic_reset_limit=_int(env, "BYTEPS_ELASTIC_RESET_LIMIT", None),
            elastic_worker_name=_text(env, "BYTEPS_ELASTIC_WORKER_NAME"),
            job_token=token,
            encrypt=_flag(env, "BYTEPS_ENCRYPT"),
            local_uids=_uids(env, "BYTEPS_LOCAL_UIDS"),
            max_tensor_bytes=_int(env, "BYTEPS_MAX_TENSOR_BYTES"),
            listen_any=_flag(env, "BYTEPS_LISTEN_ANY"),
            cluster=cluster,
            settings=table_entries(env),
        )
        config.check_rules()
        return config

    def check_rules(self) -> None:
        """The rules that tie variables together."""
        if self.heartbeat_interval >= self.heartbeat_timeout:
            raise ConfigError(
                f"PS_HEARTBEAT_INTERVAL={self.heartbeat_interval:g} is not valid: it must be "
                f"shorter than PS_HEARTBEAT_TIMEOUT={self.heartbeat_timeout:g}, or every "
                "node would be declared dead between two heartbeats")
        if self.trace_end_step < self.trace_start_step:
            raise ConfigError(
                f"BYTEPS_TRACE_END_STEP={self.trace_end_step} is not valid: it comes before "
                f"BYTEPS_TRACE_START_STEP={self.trace_start_step}")
        max_nodes = SETTINGS["DMLC_NUM_WORKER"].maximum
        if self.size > max_nodes:
            raise ConfigError(
                f"DMLC_NUM_WORKER={self.num_worker} x BYTEPS_LOCAL_SIZE={self.local_size} "
                f"is more than {max_nodes} worker processes")
        if self.worker_id >= self.num_worker:
            raise ConfigError(
                f"DMLC_WORKER_ID={self.worker_id} is not valid: expected 0 to "
                f"DMLC_NUM_WORKER-1 ({self.num_worker - 1})")
        if self.local_rank >= self.local_size:
            raise ConfigError(
                f"BYTEPS_LOCAL_RANK={self.local_rank} is not valid: expected 0 to "
                f"BYTEPS_LOCAL_SIZE-1 ({self.local_size - 1})")

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
        if self.encrypt and not self.job_token:  # (bpslaunch makes the token, later)
            raise ConfigError(ENCRYPT_WITHOUT_TOKEN)
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


def environment() -> dict[str, str]:
    """A copy of this process's environment: the one place besides Config that reads it,
    for the launcher to build its children's environments on."""
    return dict(os.environ)


class _UntilTheUserLogs(logging.Filter):
    """Our handler speaks only while the user has set up no logging of their own: once
    the root logger has a handler, tf_bps's records reach the user through it (they
    propagate, as a library's should), and are printed once, there."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


def configure_logging(config: Config, prefix: str) -> logging.Logger:
    """Sets up the "tf_bps" logger (and only it) for this process: BYTEPS_LOG_LEVEL, and
    a stderr handler whose lines carry the time, `prefix` (the role and rank) and this
    machine's name, as the core's lines do (custom_ops/common/logging.cc)."""
    logger = logging.getLogger("tf_bps")
    logger.setLevel("DEBUG" if config.log_level == "TRACE" else config.log_level)
    logger.propagate = True
    for handler in [h for h in logger.handlers if getattr(h, "_tf_bps", False)]:
        logger.removeHandler(handler)
    handler = logging.StreamHandler()
    handler._tf_bps = True
    handler.addFilter(_UntilTheUserLogs())
    handler.setFormatter(logging.Formatter(
        f"[%(asctime)s.%(msecs)03d {prefix} on {socket.gethostname()} %(levelname)s] "
        "%(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    return logger
