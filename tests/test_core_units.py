"""Builds and runs the core's C++ unit tests (tests/cpp): reduce kernels, the wire
format, partitioning rules, request checks, a pipeline stage and its credits, the timeline, and the
server's round policies, in one process and without TensorFlow."""

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.build


def unit_test_sources() -> list[str]:
    """The tests and the pieces they exercise (native_sources.bzl, which BUILD's
    core_unit_test reads too)."""
    lists: dict = {}
    exec((ROOT / "native_sources.bzl").read_text(), {"__builtins__": {}}, lists)
    return [str(ROOT / path) for path in lists["UNIT_TEST_PIECES"] + lists["UNIT_TEST_SOURCES"]]


def crypto_linkopts() -> list[str]:
    lists: dict = {}
    exec((ROOT / "native_sources.bzl").read_text(), {"__builtins__": {}}, lists)
    return lists["CRYPTO_LINKOPTS"]


def test_core_unit_tests(tmp_path):
    binary = tmp_path / "core_unit_test"
    compiler = os.environ.get("CXX", "g++")
    flags = ["-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra"]

    def compile_one(source: str) -> tuple[str, subprocess.CompletedProcess]:
        target = str(tmp_path / (Path(source).name + ".o"))
        return target, subprocess.run([compiler, *flags, "-c", source, "-o", target],
                                      capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        compiled = list(pool.map(compile_one, unit_test_sources()))
    for _, build in compiled:
        assert build.returncode == 0, build.stderr
    link = subprocess.run([compiler, "-pthread", *[target for target, _ in compiled],
                           *crypto_linkopts(), "-o", str(binary)],
                          capture_output=True, text=True, timeout=120)
    assert link.returncode == 0, link.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "core unit tests passed" in run.stdout
