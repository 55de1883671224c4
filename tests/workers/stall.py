"""The stall inspector: rank 1 pushes tensor 'laggard' STALL_DELAY seconds after
rank 0 does (host tensors through the core's C API, no TensorFlow). Prints a REPORT
with each rank's outcome."""

import json
import os
import time

import numpy as np
from core_api import Memory, enqueue, load

import tf_bps as bps

core = load()
bps.init()
rank = bps.rank()
if rank == 1:
    time.sleep(float(os.environ["STALL_DELAY"]))
report = {"rank": rank}
start = time.monotonic()
try:
    result = enqueue(core, Memory(None), "push_pull", "laggard", np.ones(10, np.float32)).wait(60)
    report["laggard"] = float(result.sum())
except RuntimeError as error:
    report["laggard"] = str(error)
report["seconds"] = round(time.monotonic() - start, 1)
bps.shutdown()
print("REPORT " + json.dumps(report), flush=True)
