"""PERSEUS_ALLREDUCE_NANCHECK on a tensor in device memory (host memory standing in for
the device): rank 1's tensor holds a NaN in a late partition, which reaches the host
after earlier ones have left. Rank 1's push_pull fails naming the NaN; rank 0's fails at
once as abandoned, not at the timeout; then both sum a clean tensor. Prints a REPORT."""

import json
import time

import numpy as np
from core_api import Memory, enqueue, load

import tf_bps as bps

core = load()
assert core.bps_device_use(None) == 0
bps.init()
rank = bps.rank()
memory = Memory(0)
values = np.ones(400_000, np.float32)
if rank == 1:
    values[350_000] = np.nan
report = {"rank": rank}
start = time.monotonic()
try:
    enqueue(core, memory, "push_pull", "nan_probe", values).wait(60)
    report["nan"] = "accepted"
except RuntimeError as error:
    report["nan"] = str(error)
report["seconds"] = time.monotonic() - start
clean = enqueue(core, memory, "push_pull", "clean", np.ones(1000, np.float32)).wait(60)
report["clean"] = float(clean.sum())
bps.shutdown()
print("REPORT " + json.dumps(report), flush=True)
