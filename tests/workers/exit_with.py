"""Pushes once, then rank 1 exits with the status given (others wait a while).

Through the core's C API, without TensorFlow: what the tests check is the launcher's
answer to a worker's exit, not TensorFlow."""

import sys
import time

import numpy as np
from core_api import Memory, enqueue, load

import tf_bps as bps

core = load()
bps.init()
enqueue(core, Memory(None), "push_pull", "once", np.ones(3, np.float32)).wait(None)
if bps.rank() == 1:
    sys.exit(int(sys.argv[1]))
time.sleep(60)
