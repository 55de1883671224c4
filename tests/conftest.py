"""pytest's fixtures and hooks for the suite; the helpers live in harness.py."""

import os

import pytest
from harness import JOB_FIXTURES, Processes

# Every process the suite starts inherits this. numpy's OpenBLAS otherwise starts a
# thread per core that spins while the process imports TensorFlow (0.2 s of CPU each, on
# 2 cores, in some 250 processes); no test does linear algebra big enough to need them.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture
def procs():
    """Processes a test starts, each ended (by PID) when the test ends."""
    processes = Processes()
    yield processes
    processes.end_all()


# The files that take longest, longest first (Bazel's from a cold cache). pytest-xdist's
# --dist loadfile hands out files in collection order (--no-loadscope-reorder, in
# pyproject.toml), so these start at once and the short ones fill in around them,
# instead of one of them starting last and running on alone.
LONGEST_FILES = ("test_bazel.py", "test_elastic.py", "test_drop_in.py", "test_elastic_launch.py",
                 "test_spark.py", "test_examples.py", "test_collectives.py", "test_ray.py",
                 "test_memory.py")


def pytest_collection_modifyitems(items):
    """Every test is `unit`, `job`, `build` or `engine` (pytest -m unit: the fast ones). A module
    may mark itself; otherwise a test that starts processes (through `procs`, or a
    module_job fixture) is a job. The longest files go first."""
    items.sort(key=lambda item: _cost_rank(item.path.name))
    kinds = ("unit", "job", "build", "engine")
    for item in items:
        if any(item.get_closest_marker(kind) for kind in kinds):
            continue
        starts = "procs" in item.fixturenames or JOB_FIXTURES & set(item.fixturenames)
        item.add_marker("job" if starts else "unit")


def _cost_rank(file_name: str) -> int:
    return LONGEST_FILES.index(file_name) if file_name in LONGEST_FILES else len(LONGEST_FILES)
