"""push_pulls of TEST_ELEMENTS floats with known sums for a while (TEST_ROUNDS rounds,
20 ms apart), checking each; prints SUMS OK at the end, or exits 1 at the first wrong
value."""

import os
import sys
import time

import numpy as np
import tensorflow as tf

import tf_bps as bps

bps.init()
rank, size = bps.rank(), bps.size()
print("READY", flush=True)
elements = int(os.environ.get("TEST_ELEMENTS", "50000"))
for step in range(int(os.environ.get("TEST_ROUNDS", "100"))):
    got = bps.push_pull(tf.fill([elements], float(rank + step)), op=bps.Sum, name="steady")
    want = float(sum(range(size)) + size * step)
    if not np.all(got.numpy() == want):
        print(f"WRONG round {step}: {got.numpy()[:4]} where {want} was due", flush=True)
        sys.exit(1)
    time.sleep(0.02)
print(f"SUMS OK {rank}", flush=True)
bps.shutdown()
