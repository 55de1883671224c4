"""Synchronous training in an elastic job (BYTEPS_ELASTIC=1) with no elastic.run: a
lost server must cost nothing, so any error ends this script. Each step push_pulls
three tensors of many partitions, each worker's values depending on its rank and the
step (a contribution of another round, or a sum missing one, would show), and every
third step broadcasts from rank 0; every element is checked.

argv: steps, the step at which the last rank pauses, the pause in seconds. It prints
PAUSING before that step: the other workers' rounds of the step then wait at every
server, unfinished, for as long as the pause lasts. A REPORT line ends it.

Through the core's C API with numpy arrays, without TensorFlow: a lost server is the
core's and the servers' business, and TensorFlow's start was most of this worker's
cost."""

import json
import sys
import time

import numpy as np
from core_api import Memory, enqueue, load

import tf_bps as bps

STEPS, PAUSE_AT, PAUSE_S = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
ELEMENTS = 200_000  # 800 KB: many partitions on every server

core = load()
bps.init()
rank, size = bps.rank(), bps.size()
memory = Memory(None)


def push_pull(value: float, name: str) -> np.ndarray:
    values = np.full(ELEMENTS, value, np.float32)
    return enqueue(core, memory, "push_pull", name, values).wait(None)


def broadcast(value: float, name: str) -> np.ndarray:
    values = np.full(ELEMENTS, value, np.float32)
    return enqueue(core, memory, "broadcast", name, values, root_rank=0).wait(None)


print(f"READY rank {rank}", flush=True)
checked = 0
for step in range(STEPS):
    if step == PAUSE_AT and rank == size - 1:
        print(f"PAUSING at step {step}", flush=True)
        time.sleep(PAUSE_S)
    for i in range(3):
        value = float((rank + 1) * (step + i + 1))
        total = push_pull(value, f"grad{i}")
        expected = (step + i + 1) * size * (size + 1) / 2
        if not np.all(total == expected):
            wrong = total[total != expected]
            raise AssertionError(f"rank {rank} step {step} tensor {i}: {wrong.size} element(s) "
                                 f"wrong (e.g. {wrong[0]}), expected {expected}")
        checked += 1
    if step % 3 == 0:
        got = broadcast(float(rank * 1000 + step), "state")
        if not np.all(got == step):
            raise AssertionError(f"rank {rank} step {step}: broadcast gave {got[got != step][0]}")
        checked += 1
    time.sleep(0.02)
print("REPORT " + json.dumps({"rank": rank, "size": size, "steps": STEPS, "checked": checked}),
      flush=True)
bps.shutdown()
