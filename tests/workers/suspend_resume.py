"""BytePS's suspend and resume in an elastic job of 3: every worker push_pulls and
suspends; workers 0 and 1 resume (worker 1 first with the wrong sizes, which it is
told of), worker 2 leaves. Prints a REPORT with the sums before and after."""

import json
import sys
import time

import tensorflow as tf

import tf_bps as bps

bps.init()
rank = bps.rank()
before = float(bps.push_pull(tf.ones([4]), op=bps.Sum, name="before")[0])
bps.suspend()
if rank == 2:
    sys.exit(0)
time.sleep(0.5)
told = ""
if rank == 1:
    try:
        bps.resume(3, 1)
    except ValueError as error:
        told = str(error)
else:
    bps.resume(2, 1, global_rank=0)
after = float(bps.push_pull(tf.ones([4]), op=bps.Sum, name="after")[0])
print("REPORT " + json.dumps({"rank": bps.rank(), "before": before, "after": after,
                              "size": bps.size(), "told": told}), flush=True)
bps.shutdown()
