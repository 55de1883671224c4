"""Builds and runs the core's C++ unit tests (tests/cpp): reduce kernels, the wire
format, partitioning rules, request checks, a pipeline stage and its credits, the timeline, and the
server's round policies, in one process and without TensorFlow. Where bazel is
installed, test_bazel.py's `bazel test //...` builds and runs the same tests instead:
compiling them twice would cost a cold run a minute of both cores."""

import hashlib
import os
import shutil
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


# Objects of earlier runs, by what they were compiled from (ignored by git, as build/ is).
OBJECTS = ROOT / "build" / "core_unit_objects"


@pytest.mark.skipif(shutil.which("bazel") is not None,
                    reason="bazel is installed: test_bazel.py builds and runs these same unit "
                    "tests (//:core_unit_test, from native_sources.bzl's lists)")
def test_core_unit_tests(tmp_path):
    binary = tmp_path / "core_unit_test"
    compiler = os.environ.get("CXX", "g++")
    flags = ["-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra"]
    # Compiling is most of this test's 25 s, and between two runs few sources change. An
    # object is reused only where the compiler, its flags and the whole preprocessed
    # source (every header included) are the same: that compile succeeded already and
    # would make the same object; anything else is compiled again. Linking and running
    # the tests happen every time.
    identity = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                              check=True).stdout + " ".join(flags)
    OBJECTS.mkdir(parents=True, exist_ok=True)
    used = set()

    def compile_one(source: str) -> tuple[str, subprocess.CompletedProcess]:
        target = str(tmp_path / (Path(source).name + ".o"))
        expanded = subprocess.run([compiler, *flags, "-E", source], capture_output=True,
                                  timeout=300)
        if expanded.returncode == 0:
            key = hashlib.sha256(identity.encode() + b"\0" + expanded.stdout).hexdigest()
            cached = OBJECTS / f"{key}.o"
            used.add(cached.name)
            if cached.exists():
                shutil.copyfile(cached, target)
                return target, subprocess.CompletedProcess([], 0, "", "")
        build = subprocess.run([compiler, *flags, "-c", source, "-o", target],
                               capture_output=True, text=True, timeout=300)
        if build.returncode == 0 and expanded.returncode == 0:
            partial = OBJECTS / f"{key}.{os.getpid()}.part"
            shutil.copyfile(target, partial)
            os.replace(partial, cached)  # whole or absent, for a run beside this one
        return target, build

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        compiled = list(pool.map(compile_one, unit_test_sources()))
    for _, build in compiled:
        assert build.returncode == 0, build.stderr
    for stale in OBJECTS.glob("*.o"):  # objects of sources since changed
        if stale.name not in used:
            stale.unlink(missing_ok=True)
    link = subprocess.run([compiler, "-pthread", *[target for target, _ in compiled],
                           *crypto_linkopts(), "-o", str(binary)],
                          capture_output=True, text=True, timeout=120)
    assert link.returncode == 0, link.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "core unit tests passed" in run.stdout
