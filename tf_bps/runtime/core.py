"""Python's view of the native engines (no TensorFlow involved).

The worker engine is reached through the pybind11 module `_bps_worker` (which calls
the core's C API, as the TensorFlow kernels do); it raises `CoreError`, a RuntimeError
whose `kind` names what failed ("mismatch", ...). The server is a native program of
its own, `bps_server` (server_executable).
"""

from __future__ import annotations

import ctypes
import functools
import hmac
import importlib
import importlib.util
from pathlib import Path

from tf_bps.runtime.config import Config, is_local_address
from tf_bps.runtime.server_shares import server_shares

# The native libraries and the server program lie at the top of the package.
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


class NotBuiltError(RuntimeError):
    """A native library of tf_bps is missing: the package was not built."""


def native_library(stem: str) -> Path:
    """Path of a built library of this package (stem: _bps_core or _bps_tf_ops)."""
    found = sorted(_PACKAGE_DIR.glob(f"{stem}*.so"))
    if not found:
        raise NotBuiltError(
            f"{stem} is not built in {_PACKAGE_DIR}: install tf_bps with "
            "`pip install --no-build-isolation .` (see README.md)")
    return found[0]


@functools.cache  # Also keeps importlib out of tf.function traces (AutoGraph warns).
def _module(name: str):
    try:
        return importlib.import_module(f"tf_bps.{name}")
    except ImportError as error:
        raise NotBuiltError(f"tf_bps.{name} cannot be loaded ({error}): install tf_bps with "
                            "`pip install --no-build-isolation .` (see README.md)") from error


def worker_engine():
    return _module("_bps_worker")


def server_executable() -> Path:
    """The native server program built into this package."""
    path = _PACKAGE_DIR / "bps_server"
    if not path.exists():
        raise NotBuiltError(f"bps_server is not built in {_PACKAGE_DIR}: install tf_bps with "
                            "`pip install --no-build-isolation .` (see README.md)")
    return path


def set_logging(config: Config, prefix: str) -> None:
    worker_engine().set_logging(config.core_log_level(), prefix)


def gpu_library() -> Path | None:
    """The core's CUDA library (_bps_gpu), where this build has one."""
    found = sorted(_PACKAGE_DIR.glob("_bps_gpu*.so"))
    return found[0] if found else None


def preload_nccl() -> str | None:
    """Loads NCCL from the nvidia-nccl-cu12 wheel (pip install tf_bps[gpu]) where it is
    installed, so that the core's CUDA library, which asks for libnccl.so.2 by name
    when a host's workers first merge device tensors, finds this copy. Returns its path;
    None where the wheel is absent (a libnccl.so.2 on the library path serves then)."""
    spec = importlib.util.find_spec("nvidia")  # the NVIDIA wheels' namespace package
    # nvidia/nccl/lib (CUDA 12 wheels), or a folder per CUDA version (nvidia/cu13/lib).
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for library in sorted(Path(folder).glob("*/lib/libnccl.so.2")):
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            return str(library)
    return None


def _use_gpus() -> None:
    """Lets TensorFlow's GPU kernels hand the core device memory: the core stages it
    through the CUDA library's device table. A table loaded before (a test's, through
    the C API) stays."""
    library = gpu_library()
    if library and not worker_engine().device_table():
        preload_nccl()
        worker_engine().device_use(str(library))


def worker_init_local() -> None:
    _use_gpus()
    worker_engine().init_local()


def worker_init(rank: int, size: int, servers: list[str], merge_with: list[int],
                worker_hosts: list[str], config: Config, generation: int = 0,
                notify_fd: int = -1) -> None:
    """Connects to the servers ("host:port"); same-host ones over a Unix socket. With
    other workers in `merge_with` (ranks of this host, this one included, that the
    scheduler found merging), push_pull partitions are summed among them first. Where
    the job's workers (`worker_hosts`) and servers are on several hosts, partitions
    are cut for a network, and in the hybrid layout the servers get the BytePS paper's
    uneven shares (server_shares.py); every worker reads the same address book, so all
    agree. `generation` is the address book's job generation (the scheduler starts a
    new one whenever an elastic job re-forms): servers of another refuse this worker.
    A synchronous elastic job's worker keeps a lost server's partitions until the
    scheduler says where they go (worker_move_lost_server); `notify_fd` gets a byte
    whenever a server is lost."""
    addresses = []
    for server in servers:
        host, port = server.rsplit(":", 1)
        addresses.append((host, int(port), config.enable_ipc and is_local_address(host)))
    server_hosts = [host for host, _, _ in addresses]
    shares = server_shares(server_hosts, list(worker_hosts))
    # Abstract socket names are per network namespace, and any process of the host may
    # bind one: keyed by the job token, nobody without it can take ours first. The
    # scheduler's address and the generation make them per job and per membership.
    where = f"local merge|{config.root_uri}:{config.root_port}|{generation}".encode()
    prefix = f"tf_bps-{hmac.new(config.job_token.encode(), where, 'sha256').hexdigest()[:32]}-"
    worker_engine().set_local_uids(list(config.local_uids))
    _use_gpus()
    worker_engine().init(rank, size, addresses, config.job_token, list(config.settings),
                         sorted(merge_with), prefix,
                         across_hosts=len({*worker_hosts, *server_hosts}) > 1,
                         server_shares=shares, generation=generation,
                         move_lost_servers=moves_lost_servers(config), notify_fd=notify_fd)


def moves_lost_servers(config: Config) -> bool:
    """Whether this job's workers move a lost server's partitions to the servers left
    instead of failing: synchronous elastic jobs (asynchronous training keeps its
    parameters at the servers, so a lost one is seeded again as the job re-forms)."""
    return config.elastic and not config.enable_async


def worker_abort(reason: str) -> None:
    worker_engine().abort(reason)


def worker_lost_servers() -> list[int]:
    """The indices (in the address book) of the servers that went away without a
    word, in that order."""
    return worker_engine().lost_servers()


def worker_move_lost_server(index: int) -> None:
    """The scheduler says server `index` (in the address book) is gone from the job:
    its partitions go to the servers left."""
    worker_engine().move_lost_server(index)


def worker_failure() -> str:
    """Why the worker can no longer communicate; empty while it is healthy."""
    return worker_engine().failure()


def worker_start_timeline(path: str, first_step: int = 1, last_step: int = 0) -> None:
    """Records the timeline of the operations that start from now on, of steps
    `first_step` to `last_step` (0: no end), into the file `path`. A recording in
    progress ends, and this returns once its file is written (as worker_stop_timeline)."""
    worker_engine().start_timeline(path, first_step, last_step)


def worker_stop_timeline() -> None:
    """Ends the recording in progress, if any, and returns once its file is written (or
    after the operation timeout, if operations it took still run then)."""
    worker_engine().stop_timeline()


def worker_declare(names: list[str]) -> None:
    """Gives the tensors their priority in this order (earlier goes first), unless they
    already have one."""
    worker_engine().declare(list(names))


def worker_set_process_set(set_id: int, ranks: list[int]) -> None:
    """Registers (ranks) or removes (no ranks) a process set here and at every server."""
    worker_engine().set_process_set(set_id, list(ranks))


def worker_join() -> int:
    """Blocks until every worker has joined; the last rank to join."""
    return worker_engine().join()


def worker_shutdown() -> None:
    worker_engine().shutdown()


def worker_stats() -> dict:
    """What this process's workers have done since it started (bps_worker_stats in
    c_api.h): steps, bytes, push_pull latencies by size class and bucket."""
    return worker_engine().read_stats()


def worker_stats_bounds() -> tuple[list[int], list[float]]:
    """The upper bounds of worker_stats's size classes (bytes) and latency buckets
    (seconds); the last class and bucket have none."""
    return worker_engine().stats_bounds()
