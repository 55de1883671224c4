"""Asynchronous push_pull (BYTEPS_ENABLE_ASYNC=1) of a tensor in device memory, host
memory standing in for the device. The first push of every worker stores rank 0's
value at the servers and returns it; a later push adds a weight delta and returns the
parameters at once, with the other worker's delta in them or not yet. Prints a REPORT."""

import json

import numpy as np
from core_api import Memory, enqueue, load

import tf_bps as bps

core = load()
assert core.bps_device_use(None) == 0
bps.init()
rank = bps.rank()
memory = Memory(0)
n = 300_000  # several partitions
first = enqueue(core, memory, "async_push_pull", "weights",
                np.full(n, rank + 1.0, np.float32)).wait()
delta = np.full(n, 10.0 * (rank + 1), np.float32)
second = enqueue(core, memory, "async_push_pull", "weights", delta).wait()
report = {"rank": rank, "first": sorted({float(v) for v in first}),
          "second": sorted({float(v) for v in second})}
bps.shutdown()
print("REPORT " + json.dumps(report), flush=True)
