"""push_pulls of TEST_ELEMENTS floats with known sums for a while (TEST_ROUNDS rounds,
20 ms apart; TEST_SLOW_RANK's TEST_SLOW_MS later), checking each; prints SUMS OK at the
end, or exits 1 at the first wrong value (or at the core's error, raised with its
message).

Through the core's C API with numpy arrays, without TensorFlow: the tests that run this
worker check the scheduler, the servers and the wire under attack, faults and flags,
none of them TensorFlow's binding (tested on its own elsewhere), and TensorFlow's start
(seconds of CPU on a loaded 2-core machine) was most of what each of these workers
cost."""

import os
import sys
import time

import numpy as np
from core_api import Memory, enqueue, load

import tf_bps as bps

core = load()
bps.init()
rank, size = bps.rank(), bps.size()
memory = Memory(None)
print("READY", flush=True)
elements = int(os.environ.get("TEST_ELEMENTS", "50000"))
# TEST_SLOW_RANK / TEST_SLOW_MS: that rank pushes this much later every round (a straggler).
slow = float(os.environ.get("TEST_SLOW_MS", "0")) / 1000 \
    if os.environ.get("TEST_SLOW_RANK") == str(rank) else 0.0
for step in range(int(os.environ.get("TEST_ROUNDS", "100"))):
    time.sleep(slow)
    values = np.full(elements, float(rank + step), np.float32)
    # No deadline of our own: as a TensorFlow op's, the wait ends with the core's
    # answer, which BYTEPS_OP_TIMEOUT bounds.
    got = enqueue(core, memory, "push_pull", "steady", values).wait(None)
    want = float(sum(range(size)) + size * step)
    if not np.all(got == want):
        print(f"WRONG round {step}: {got[:4]} where {want} was due", flush=True)
        sys.exit(1)
    time.sleep(0.02)
print(f"SUMS OK {rank}", flush=True)
bps.shutdown()
