"""push_pulls forever (until something fails); prints the error it gets.

Through the core's C API, without TensorFlow: the tests that run it check how the core
fails its operations when a peer is lost or never comes (the message, the status, how
soon), which TensorFlow's op only passes on (mismatch.py checks that passing on)."""

import sys
import time

import numpy as np
from core_api import Memory, enqueue, load

import tf_bps as bps

core = load()
bps.init()
rank = bps.rank()
only_rank = int(sys.argv[1]) if len(sys.argv) > 1 else -1
memory = Memory(None)
x = np.ones(100_000, np.float32)
print("READY", flush=True)
step = 0
try:
    while True:
        if only_rank in (-1, rank):
            enqueue(core, memory, "push_pull", f"loop{step % 4}", x).wait(None)
        step += 1
        time.sleep(0.01)
except RuntimeError as error:
    print("ERROR " + str(error).replace("\n", " "), flush=True)
    sys.exit(3)
