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


def pytest_collection_modifyitems(items):
    """Every test is `unit`, `job`, `build` or `engine` (pytest -m unit: the fast ones). A module
    may mark itself; otherwise a test that starts processes (through `procs`, or a
    module_job fixture) is a job."""
    kinds = ("unit", "job", "build", "engine")
    for item in items:
        if any(item.get_closest_marker(kind) for kind in kinds):
            continue
        starts = "procs" in item.fixturenames or JOB_FIXTURES & set(item.fixturenames)
        item.add_marker("job" if starts else "unit")
