"""The device merge's refusals, on stand-in devices of their own (the host's workers
sum with the stand-in collectives): the host's two workers push the same tensor name
with different sizes, which both refuse naming both ranks; then both sum a tensor as
usual; then rank 1 never pushes 'lonely', for which rank 0 gives up within the
operation timeout naming rank 1. Prints a REPORT."""

import json
import time

import numpy as np
from core_api import Memory, enqueue, load

import tf_bps as bps

core = load()
assert core.bps_device_use(None) == 0
bps.init()
rank = bps.rank()
memory = Memory(bps.local_rank())
report = {"rank": rank}


def outcome(name: str, values: np.ndarray) -> str:
    try:
        enqueue(core, memory, "push_pull", name, values).wait(60)
        return "accepted"
    except RuntimeError as error:
        return str(error)


report["mismatch"] = outcome("sized", np.ones(1000 * (rank + 1), np.float32))
clean = enqueue(core, memory, "push_pull", "clean", np.ones(300_000, np.float32)).wait(60)
report["clean"] = float(clean[:5].sum() + clean[-5:].sum())
if rank == 0:
    start = time.monotonic()
    report["lonely"] = outcome("lonely", np.ones(1000, np.float32))
    report["lonely_seconds"] = time.monotonic() - start
bps.shutdown()
print("REPORT " + json.dumps(report), flush=True)
