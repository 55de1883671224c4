"""Builds and runs the core's C++ unit tests (tests/cpp): reduce kernels, the wire
format, partitioning rules, request checks, a pipeline stage and its credits, the timeline, and the
server's round policies, in one process and without TensorFlow."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The pieces under test, without the worker and the C API (which they do not need).
SOURCES = [ROOT / "custom_ops" / "core" / f"{name}.cc"
           for name in ("common", "logging", "protocol", "reduce", "task", "credits", "timeline")]
SOURCES += [ROOT / "custom_ops" / "core" / "transport" / f"{name}.cc"
            for name in ("socket", "shared_memory", "transport", "shared_memory_channel", "auth")]
SOURCES.append(ROOT / "custom_ops" / "server" / "server.cc")


def test_core_unit_tests(tmp_path):
    binary = tmp_path / "core_unit_test"
    compiler = os.environ.get("CXX", "g++")
    build = subprocess.run(
        [compiler, "-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra",
         str(ROOT / "tests" / "cpp" / "core_unit_test.cc"), *map(str, SOURCES), "-o", str(binary)],
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "core unit tests passed" in run.stdout
