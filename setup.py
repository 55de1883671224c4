"""Builds the native libraries of tf_bps.

_bps_core: the framework-neutral worker engine behind its C API (c_api.h); the
    TensorFlow kernels and the Python binding both call it through that API.
_bps_tf_ops: the TensorFlow kernels, linked against _bps_core and compiled with the
    flags of the installed TensorFlow (tf.sysconfig); GPU kernels too where a CUDA
    toolkit is found.
_bps_worker: the pybind11 module Python uses to start and stop the worker engine.
bps_server: the summation server, a native executable with no Python and no TensorFlow
    (`bps-server` runs it); an operator can copy it alone to a CPU-only server machine.
_bps_gpu: the core's CUDA kernels behind their C API (worker/cuda/gpu_api.h), built only
    when a CUDA toolkit is found (see cuda_toolkit); without one the build is CPU only.
"""

import importlib.util
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def native_sources() -> dict:
    """The source lists and flags BUILD uses too (native_sources.bzl: plain list
    assignments, so Starlark and Python read them alike). Paths are relative to the
    project root, where pip runs this file."""
    lists: dict = {}
    exec(Path("native_sources.bzl").read_text(), {"__builtins__": {}}, lists)
    return lists


NATIVE = native_sources()
CXXFLAGS = NATIVE["CXXFLAGS"]


def cuda_toolkit() -> str | None:
    """nvcc: $CUDA_HOME/bin/nvcc, else the one on PATH; None (a CPU-only build) when
    there is none, or with TF_BPS_WITHOUT_CUDA=1. (NVIDIA's CUDA 12 wheels carry
    ptxas and headers but no nvcc, so they cannot build.)"""
    if os.environ.get("TF_BPS_WITHOUT_CUDA") == "1":
        return None
    home = os.environ.get("CUDA_HOME")
    if home and Path(home, "bin", "nvcc").exists():
        return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc")


class BuildNative(build_ext):
    """Compiles with g++ directly: a handful of shared libraries and one executable need
    no build system."""

    def run(self):
        super().run()
        self.build_server()

    def server_path(self) -> Path:
        return Path(self.get_ext_fullpath("tf_bps._bps_core")).resolve().parent / "bps_server"

    def build_server(self):
        # Linked statically, libc too: the file runs on any Linux server machine.
        cmd = [os.environ.get("CXX", "g++"), *CXXFLAGS, *NATIVE["WARNINGS"],
               *NATIVE["SERVER_SOURCES"], *NATIVE["CRYPTO_LINKOPTS"],
               *NATIVE["SERVER_LINKOPTS"], "-o", str(self.server_path())]
        self.announce(" ".join(cmd), level=2)
        subprocess.check_call(cmd)

    def get_outputs(self):
        return [*super().get_outputs(), str(self.server_path())]

    def build_extension(self, ext):
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        cxx = os.environ.get("CXX", "g++")
        core = Path(self.get_ext_fullpath("tf_bps._bps_core")).resolve()
        link_core = [f"-L{core.parent}", f"-l:{core.name}", "-Wl,-rpath,$ORIGIN"]
        name = ext.name.rsplit(".", 1)[1]
        if name == "_bps_gpu":
            cmd = [cuda_toolkit(), *NATIVE["NVCC_FLAGS"], *ext.sources, "-o", str(target)]
        elif name == "_bps_core":
            cmd = [cxx, *CXXFLAGS, *NATIVE["WARNINGS"], "-shared", *ext.sources,
                   *NATIVE["CRYPTO_LINKOPTS"], "-o", str(target), f"-Wl,-soname,{target.name}"]
        elif name == "_bps_tf_ops":
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
            import tensorflow as tf  # Only the TensorFlow adapter needs it.

            gpu = NATIVE["TF_GPU_FLAGS"] if cuda_toolkit() else []
            cmd = [cxx, *CXXFLAGS, *gpu, "-shared", *NATIVE["TF_WARNINGS"],
                   *tf.sysconfig.get_compile_flags(), *ext.sources,
                   "-o", str(target), *tf.sysconfig.get_link_flags(), *link_core]
        else:  # The pybind11 module.
            import pybind11

            cmd = [cxx, *CXXFLAGS, *NATIVE["WARNINGS"], "-fvisibility=hidden", "-shared",
                   f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
                   *ext.sources, "-o", str(target), *link_core]
        self.announce(" ".join(cmd), level=2)
        subprocess.check_call(cmd)


# Without TensorFlow (a launcher or server machine, built with --no-build-isolation)
# everything but the TensorFlow operations is built; using them then says so.
WITH_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
if not WITH_TENSORFLOW:
    print("tf_bps: TensorFlow is not installed: building the launcher, scheduler and server "
          "without the TensorFlow operations")

setup(
    # Built in this order: the others link against _bps_core.
    ext_modules=[
        Extension("tf_bps._bps_core", NATIVE["CORE_SOURCES"]),
        *([Extension("tf_bps._bps_tf_ops", NATIVE["TF_SOURCES"])] if WITH_TENSORFLOW else []),
        Extension("tf_bps._bps_worker", NATIVE["WORKER_MODULE_SOURCES"]),
        *([Extension("tf_bps._bps_gpu", NATIVE["GPU_SOURCES"])] if cuda_toolkit() else []),
    ],
    cmdclass={"build_ext": BuildNative},
)
