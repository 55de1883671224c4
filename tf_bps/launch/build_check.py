"""`bpslaunch --check-build`: what this installation of tf_bps can do, as horovodrun
prints its frameworks, controllers and tensor operations. Every mark comes from a
check made now (a library loaded, a program run, a package found), not from how the
package was meant to be built.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys

import tf_bps
from tf_bps.runtime import core

# Loads the TensorFlow operations as a training script would, in a process of its own:
# TensorFlow is large and noisy, and this process never needs it.
_LOAD_OPS = "import tf_bps.runtime.ops as o; import tensorflow as tf; print(tf.__version__)"


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tensorflow_ops() -> tuple[bool, str]:
    """Whether the TensorFlow operations load, and the TensorFlow version or why not."""
    if _package_version("tensorflow") is None and _package_version("tensorflow-cpu") is None:
        return False, "TensorFlow is not installed: pip install 'tf_bps[tensorflow]'"
    try:
        done = subprocess.run([sys.executable, "-c", _LOAD_OPS], capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    except subprocess.TimeoutExpired:
        return False, "loading TensorFlow took over 120 s"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return False, lines[-1] if lines else f"status {done.returncode}"
    return True, done.stdout.strip()


def _library(name: str) -> tuple[bool, str]:
    try:
        importlib.import_module(f"tf_bps.{name}")
        return True, ""
    except ImportError as error:
        return False, str(error)


def _server() -> tuple[bool, str]:
    try:
        program = core.server_executable()
        done = subprocess.run([str(program), "--version"], capture_output=True, text=True,
                              timeout=30)
    except (core.NotBuiltError, OSError, subprocess.TimeoutExpired) as error:
        return False, str(error)
    if done.returncode != 0:
        return False, (done.stderr or done.stdout).strip()
    return True, str(program)


def report() -> int:
    """Prints the check; 0 when the core and the server work (a launcher and server
    machine needs no more), 1 otherwise."""
    ops_ok, tensorflow = _tensorflow_ops()
    engine_ok, engine_why = _library("_bps_worker")
    server_ok, server_where = _server()
    try:
        gpu_ok = core.native_library("_bps_gpu").exists()  # loaded by ctypes, not imported
    except core.NotBuiltError:
        gpu_ok = False
    keras = _package_version("keras")

    def line(ok: bool, what: str, note: str = "") -> str:
        return f"    [{'X' if ok else ' '}] {what}" + (f"  ({note})" if note else "")

    print(f"tf_bps v{tf_bps.__version__} ({os.path.dirname(tf_bps.__file__)}):\n")
    print("Available frameworks:")
    print(line(ops_ok, "TensorFlow", tensorflow))
    print(line(ops_ok and keras is not None, "Keras", keras or "not installed"))
    print("\nAvailable parts:")
    print(line(engine_ok, "Worker engine", engine_why))
    print(line(server_ok, "Summation server (bps_server)", server_where))
    print(line(True, "Scheduler and launcher"))
    print("\nAvailable transports:")
    print(line(engine_ok, "TCP"))
    print(line(engine_ok, "Shared memory (workers on one host)"))
    print(line(False, "RDMA"))
    print("\nAvailable tensor operations:")
    print(line(engine_ok, "CPU summation on the servers"))
    print(line(engine_ok, "Encryption in transit (BYTEPS_ENCRYPT, OpenSSL)"))
    print(line(False, "CUDA kernels",
               "compiled, not yet run on a GPU" if gpu_ok else "not compiled"))
    print(line(False, "NCCL, MPI, Gloo", "tf_bps synchronises through its own servers"))
    return 0 if engine_ok and server_ok else 1
