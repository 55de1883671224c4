"""Worker 1 leaves the job early (bps.shutdown, then exits) after push_pulls through
shared memory; worker 0 stays until the test has looked at the server (the file
$TEST_OUT/release appears, or a minute passes), then shuts down too. Each prints
`PID <rank> <pid>` once its push_pulls are done.

Through the core's C API with numpy arrays, without TensorFlow: the core copies them
into its shared memory all the same, and what the test checks is that memory's fate."""

import os
import sys
import time

import numpy as np
from core_api import Memory, enqueue, load

import tf_bps as bps

core = load()
bps.init()
rank = bps.rank()
for _ in range(5):
    values = np.full(300_000, float(rank), np.float32)
    got = enqueue(core, Memory(None), "push_pull", "leaving", values).wait(None)
    if float(got[-1]) != 1.0:
        print(f"WRONG sum {float(got[-1])} on rank {rank}", flush=True)
        sys.exit(1)
print(f"PID {rank} {os.getpid()}", flush=True)
if rank == 1:
    bps.shutdown()
    print("LEFT", flush=True)
    sys.exit(0)
release = os.path.join(os.environ["TEST_OUT"], "release")
deadline = time.monotonic() + 60
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.1)
bps.shutdown()
print("DONE", rank, flush=True)
