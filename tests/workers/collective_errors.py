"""Workers that disagree, or fall out of step, must get an error naming the tensor
and the ranks (never a wrong value). Prints a REPORT line per case."""

import json
import sys
import time

import tensorflow as tf

import tf_bps as bps

bps.init()
rank, size = bps.rank(), bps.size()
odd = rank == 1  # Rank 1 disagrees with everyone else.


def report(case, fn):
    started = time.monotonic()
    entry = {"rank": rank, "case": case}
    try:
        result = fn()
        entry["value"] = result.numpy().tolist()
    except tf.errors.OpError as error:
        entry["error"] = type(error).__name__
        entry["message"] = error.message
    entry["seconds"] = time.monotonic() - started
    print("REPORT " + json.dumps(entry), flush=True)


def agreeing(case):
    """After a failed round the next one on the same tensor works."""
    report(f"{case}.after", lambda: bps.push_pull(tf.ones([2]), op=bps.Sum, name=case))


MISMATCHES = {
    "shape": lambda: bps.push_pull(tf.zeros([3, 2] if odd else [2, 3]), name="shape"),
    "dtype": lambda: bps.push_pull(tf.zeros([4], tf.float64 if odd else tf.float32),
                                   name="dtype"),
    "root": lambda: bps.broadcast(tf.zeros([3]), root_rank=1 if odd else 0, name="root"),
    "op": lambda: bps.allreduce(tf.ones([3]), op=bps.Max if odd else bps.Sum, name="op"),
    "scale": lambda: bps.allreduce(tf.ones([3]), prescale_factor=2.0 if odd else 1.0,
                                   name="scale"),
    "kind": lambda: (bps.broadcast(tf.ones([3]), 0, name="kind") if odd
                     else bps.push_pull(tf.ones([3]), name="kind")),
    "gather": lambda: bps.allgather(tf.zeros([1, 3 if odd else 2]), name="gather"),
    "unnamed": lambda: bps.push_pull(tf.zeros([3 if odd else 2])),
    "graph": tf.function(lambda: bps.push_pull(tf.zeros([5 if odd else 4]), name="graph")),
}

# Traced before the clock starts: the test times the mismatch, not tracing.
MISMATCHES["graph"] = MISMATCHES["graph"].get_concrete_function()

scenario = sys.argv[1]
if scenario == "mismatch":
    for case, fn in MISMATCHES.items():
        report(case, fn)
        agreeing(case if case != "unnamed" else "PushPull.eager")
elif scenario == "stale":
    # Rank 0's first push_pull times out while rank 1 is busy; rank 1's first one then
    # belongs to a round that has ended. It must be refused, never summed with rank
    # 0's stale [100, ...]; the retry meets rank 0's second push_pull.
    if rank == 0:
        report("timed_out", lambda: bps.push_pull(tf.fill([4], 100.0), op=bps.Sum,
                                                  name="stale"))
    else:
        time.sleep(5.5)
        report("late", lambda: bps.push_pull(tf.ones([4]), op=bps.Sum, name="stale"))
    report("next", lambda: bps.push_pull(tf.ones([4]), op=bps.Sum, name="stale"))
    # Under the strategy a save is a step of every worker: the chief saving alone waits
    # BYTEPS_OP_TIMEOUT and is then told that every worker must call it.
    import os
    import tempfile

    import keras

    strategy = bps.ParameterServerStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

    def save_alone():
        model.save(os.path.join(tempfile.mkdtemp(), "alone.keras"))
        return tf.zeros([1])

    if rank == 0:
        report("save_alone", save_alone)
    else:
        time.sleep(5.5)
    report("after_save", lambda: bps.push_pull(tf.ones([4]), op=bps.Sum, name="after_save"))
bps.shutdown()
