"""Memory stays flat however a job calls us: a soak of every call pattern (soak.py:
shapes and dtypes changing under one name, names that go idle and come back, graphs, gathers of
changing row counts, broadcasts and alltoalls of changing sizes, failed rounds
retried) through a real job of two workers and two servers on one host, where every
push and result lies in shared memory. After a warm-up, neither a worker's nor a
server's private memory, mapped shared memory or own arenas grows by 32 MB, and every
value is right (soak.py exits non-zero otherwise)."""

import time

from conftest import LAUNCH, base_env, worker_command
from memory import watch_soak

MB = 1 << 20
WARM_UP = 300  # steps: every name soak.py uses has been used
ALLOWED_GROWTH = 32 * MB


def test_memory_stays_flat_under_every_call_pattern(procs):
    job = procs.start([*LAUNCH, "-np", "2", *worker_command("soak.py")],
                      base_env(TEST_STEPS=100_000, TEST_SECONDS=50, TEST_REPORT_EVERY=50))
    workers, servers, output = watch_soak(job, [WARM_UP], time.monotonic() + 150)
    procs.end(job)
    text = "".join(output)
    assert "DONE 0" in text and "DONE 1" in text, text[-5000:]
    last = max(step for rank, step in workers if rank == 0)
    # Long enough that a leak of a few hundred bytes a step would show (one of a
    # megabyte a step, as before, shows at once).
    assert last >= 3 * WARM_UP, f"only {last} steps ran"
    growth = []
    for rank in (0, 1):
        for field in ("anon", "shared", "owned"):
            grew = workers[rank, last][field] - workers[rank, WARM_UP][field]
            growth.append((f"worker {rank} {field}", grew))
    assert len({index for index, _ in servers}) == 2, servers
    for index in (0, 1):
        for field in ("anon", "shared", "owned"):
            grew = servers[index, last][field] - servers[index, WARM_UP][field]
            growth.append((f"server {index} {field}", grew))
    print(f"{last} steps; growth after step {WARM_UP} in MB:",
          ", ".join(f"{what} {grew / MB:.1f}" for what, grew in growth))
    assert all(grew < ALLOWED_GROWTH for _, grew in growth), growth
