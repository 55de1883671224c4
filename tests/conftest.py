"""pytest's fixtures and hooks for the suite; the helpers live in harness.py."""

import pytest
from harness import JOB_FIXTURES, Processes


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
