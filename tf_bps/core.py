"""ctypes binding to the framework-neutral core library (no TensorFlow involved)."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from tf_bps.config import Config, is_local_address

_PACKAGE_DIR = Path(__file__).resolve().parent


class CoreError(RuntimeError):
    """The core refused a call; the message says why."""


def native_library(stem: str) -> Path:
    """Path of a built library of this package (stem: _bps_core or _bps_tf_ops)."""
    found = sorted(_PACKAGE_DIR.glob(f"{stem}*.so"))
    if not found:
        raise CoreError(
            f"{stem} is not built in {_PACKAGE_DIR}: install tf_bps with "
            "`pip install --no-build-isolation .` (see README.md)")
    return found[0]


@functools.cache
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(native_library("_bps_core")))
    lib.bps_last_error.restype = ctypes.c_char_p
    lib.bps_set_logging.argtypes = [ctypes.c_int, ctypes.c_char_p]
    lib.bps_worker_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                    ctypes.c_longlong, ctypes.c_int]
    lib.bps_worker_abort.argtypes = [ctypes.c_char_p]
    lib.bps_worker_failure.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.bps_server_listen.restype = ctypes.c_void_p
    lib.bps_server_listen.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_int)]
    lib.bps_server_serve.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.bps_server_failure_fd.argtypes = [ctypes.c_void_p]
    lib.bps_server_failure.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.bps_server_stop.argtypes = [ctypes.c_void_p]
    return lib


def _check(result: int) -> None:
    if result != 0:
        raise CoreError(library().bps_last_error().decode())


def set_logging(config: Config, prefix: str) -> None:
    library().bps_set_logging(config.core_log_level(), prefix.encode())


def worker_init_local() -> None:
    _check(library().bps_worker_init_local())


def worker_init(rank: int, size: int, servers: list[str], config: Config) -> None:
    """Connects to the servers ("host:port"); same-host ones over a Unix socket."""
    def entry(server: str) -> str:
        host = server.rsplit(":", 1)[0]
        return f"{server}+local" if config.enable_ipc and is_local_address(host) else server

    listing = ",".join(entry(server) for server in servers)
    _check(library().bps_worker_init(rank, size, listing.encode(), config.partition_bytes,
                                     int(config.op_timeout * 1000)))


def worker_abort(reason: str) -> None:
    library().bps_worker_abort(reason.encode())


def _read_message(fill) -> str:
    buf = ctypes.create_string_buffer(4096)
    fill(buf, len(buf))
    return buf.value.decode(errors="replace")


def worker_failure() -> str:
    """Why the worker can no longer push_pull; empty while it is healthy."""
    return _read_message(library().bps_worker_failure)


def worker_shutdown() -> None:
    library().bps_worker_shutdown()


class ServerEngine:
    """The C++ summation engine. It listens from construction (so its port can be
    registered) and sums once `serve` says how many workers the job has."""

    def __init__(self, engine_threads: int, timeout_s: float, port: int = 0):
        bound = ctypes.c_int(0)
        self._handle = library().bps_server_listen(port, engine_threads, int(timeout_s * 1000),
                                                   ctypes.byref(bound))
        if not self._handle:
            raise CoreError(library().bps_last_error().decode())
        self.port = bound.value

    def serve(self, num_workers: int) -> None:
        _check(library().bps_server_serve(self._handle, num_workers))

    def failure_fd(self) -> int:
        return library().bps_server_failure_fd(self._handle)

    def failure(self) -> str:
        return _read_message(lambda buf, size: library().bps_server_failure(
            self._handle, buf, size))

    def stop(self) -> None:
        if self._handle:
            library().bps_server_stop(self._handle)
            self._handle = None
