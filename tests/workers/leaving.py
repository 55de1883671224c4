"""Worker 1 leaves the job early (bps.shutdown, then exits) after push_pulls through
shared memory; worker 0 stays until the test has looked at the server (the file
$TEST_OUT/release appears, or a minute passes), then shuts down too. Each prints
`PID <rank> <pid>` once its push_pulls are done."""

import os
import sys
import time

import tensorflow as tf

import tf_bps as bps

bps.init()
rank = bps.rank()
for _ in range(5):
    got = bps.push_pull(tf.fill([300_000], float(rank)), average=False, name="leaving")
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
