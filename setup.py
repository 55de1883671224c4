"""Builds the two native libraries of tf_bps.

_bps_core: the framework-neutral core (worker engine, transport, server engine);
    it needs no TensorFlow, so `bps-server` never loads TensorFlow.
_bps_tf_ops: the TensorFlow kernels, linked against _bps_core and compiled with the
    flags of the installed TensorFlow (tf.sysconfig).
"""

import os
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# setuptools wants sources relative to the project root, where pip runs this file.
CORE_SOURCES = sorted(str(p) for layer in ("core", "server")
                      for p in Path("custom_ops", layer).glob("*.cc"))
TF_SOURCES = sorted(str(p) for p in Path("custom_ops", "tf").glob("*.cc"))
CXXFLAGS = ["-std=c++17", "-O3", "-fPIC", "-pthread", "-fvisibility-inlines-hidden"]


class BuildNative(build_ext):
    """Compiles with g++ directly: two shared libraries need no build system."""

    def build_extension(self, ext):
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        cxx = os.environ.get("CXX", "g++")
        if ext.name.endswith("_bps_core"):
            cmd = [cxx, *CXXFLAGS, "-Wall", "-Wextra", "-shared", *ext.sources, "-o",
                   str(target), f"-Wl,-soname,{target.name}"]
        else:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
            import tensorflow as tf  # Only the TensorFlow adapter needs it.

            core = Path(self.get_ext_fullpath("tf_bps._bps_core")).resolve()
            cmd = [cxx, *CXXFLAGS, "-shared", "-Wno-deprecated-declarations",
                   "-Wno-interference-size", *tf.sysconfig.get_compile_flags(), *ext.sources,
                   "-o", str(target), *tf.sysconfig.get_link_flags(),
                   f"-L{core.parent}", f"-l:{core.name}", "-Wl,-rpath,$ORIGIN"]
        self.announce(" ".join(cmd), level=2)
        subprocess.check_call(cmd)


setup(
    ext_modules=[
        Extension("tf_bps._bps_core", CORE_SOURCES),
        Extension("tf_bps._bps_tf_ops", TF_SOURCES),
    ],
    cmdclass={"build_ext": BuildNative},
)
