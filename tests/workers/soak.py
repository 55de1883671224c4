"""A long mix of the call patterns users write, checked value by value, reporting this
worker's memory as it goes: unnamed eager push_pulls whose shape and dtype change
from call to call, named ones, names made per step, a tf.function, allgathers whose
row count changes, broadcasts and alltoalls of changing sizes, and rounds that fail
(workers disagree on a shape) and are retried. Every TEST_REPORT_EVERY steps it prints
`MEMORY {"rank", "step", "last", "anon", "shared", "owned"}` (bytes; memory.py), and at
the end `DONE <rank>`. Exits non-zero at the first wrong value."""

import json
import os
import sys

import numpy as np
import tensorflow as tf
from memory import process_memory

import tf_bps as bps

bps.init()
rank, size = bps.rank(), bps.size()
steps = int(os.environ.get("TEST_STEPS", "200"))
report_every = int(os.environ.get("TEST_REPORT_EVERY", "50"))
# > 0: stop after about this long too (checked at each report).
seconds = float(os.environ.get("TEST_SECONDS", "0"))

# Unnamed eager push_pulls all share one name, so each of these changes the shape
# (and the dtype) under it; the largest spans several partitions.
SHAPES = [(1,), (7, 3), (1000,), (65536,), (1024, 257), (300_000,)]
DTYPES = [tf.float32, tf.int32, tf.float64]
ROTATING_NAMES = 300


def check(what: str, step: int, got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.array_equal(got, want):
        print(f"WRONG {what} at step {step} on rank {rank}: got {got.shape} "
              f"{got.ravel()[:4]}, want {want.shape} {want.ravel()[:4]}", flush=True)
        sys.exit(1)


def fill(shape, value, dtype=tf.float32):
    return tf.fill(shape, tf.cast(value, dtype))


@tf.function
def graph_sums(x, y):
    return (bps.push_pull(x, average=False, name="soak.graph.x"),
            bps.push_pull(y, average=False, name="soak.graph.y"))


def one_step(step: int) -> None:
    ranks_sum = sum(range(size))
    # Unnamed eager calls of changing shapes and dtypes.
    for i, shape in enumerate(SHAPES):
        dtype = DTYPES[(step + i) % len(DTYPES)]
        got = bps.push_pull(fill(shape, step + rank, dtype), average=False)
        check(f"unnamed push_pull {shape}", step, got, np.full(shape, size * step + ranks_sum,
                                                             dtype.as_numpy_dtype))
    # Named tensors of fixed shape: the steady state of training.
    for i in range(4):
        got = bps.push_pull(fill([4096 * (i + 1)], rank + i), average=False,
                            name=f"soak.named.{i}")
        check(f"named push_pull {i}", step, got, np.full([4096 * (i + 1)], ranks_sum + size * i))
    # Names made per step, each used again only after it has been idle for longer than
    # SharedSlots::kIdleAfter: their memory goes meanwhile, and comes back. (A name
    # used once for good costs TensorFlow an eager kernel of its own, about 35 KB that
    # it never frees, whatever the op.)
    name = f"soak.rotating.{step % ROTATING_NAMES}"
    got = bps.push_pull(fill([16384], rank + step), average=False, name=name)
    check("push_pull of a rotating name", step, got, np.full([16384], ranks_sum + size * step))
    # A graph: the same two tensors every step.
    x, y = graph_sums(fill([5000], rank), fill([3, 333], step))
    check("graph push_pull", step, x, np.full([5000], ranks_sum))
    check("graph push_pull", step, y, np.full([3, 333], size * step))
    # allgather whose row count changes with the step (as predictions of varying batches).
    rows = [1 + (step * 7 + r * 13) % 300 for r in range(size)]
    got = bps.allgather(fill([rows[rank] * 16, 64], rank))
    check("allgather", step, got, np.concatenate(
        [np.full([rows[r] * 16, 64], r, np.float32) for r in range(size)]))
    # broadcast of a changing size from a changing root.
    root = step % size
    length = 1 + (step * 4099) % 200_000
    got = bps.broadcast(fill([length], step * 10 + rank), root_rank=root)
    check("broadcast", step, got, np.full([length], step * 10 + root, np.float32))
    # alltoall of changing splits: rank r sends (step + r + d) % 5 rows to rank d.
    splits = [(step + rank + d) % 5 for d in range(size)]
    got, received = bps.alltoall(fill([sum(splits), 256], rank), splits=splits)
    want_splits = [(step + r + rank) % 5 for r in range(size)]
    check("alltoall splits", step, received, want_splits)
    check("alltoall", step, got, np.concatenate(
        [np.full([want_splits[r], 256], r, np.float32) for r in range(size)]))
    # A round that fails (the workers disagree on the shape) and is retried.
    if step % 10 == 0:
        try:
            bps.push_pull(fill([2000 + 1000 * rank], 1.0), name="soak.retried")
            print(f"WRONG mismatched push_pull at step {step} succeeded on rank {rank}",
                  flush=True)
            sys.exit(1)
        except tf.errors.FailedPreconditionError:
            pass
        got = bps.push_pull(fill([2000], rank), average=False, name="soak.retried")
        check("retried push_pull", step, got, np.full([2000], ranks_sum))


def report(step: int, last: bool = False) -> None:
    memory = process_memory(os.getpid())
    print("MEMORY " + json.dumps({"rank": rank, "step": step, "last": last, **memory}),
          flush=True)


def time_is_up() -> bool:
    """Rank 0's clock decides for everyone, so that all stop at the same step."""
    up = tf.constant(bool(seconds) and float(tf.timestamp() - started) > seconds)
    return bool(bps.broadcast(up, root_rank=0, name="soak.stop").numpy())


started = tf.timestamp()
step = 0
for step in range(1, steps + 1):
    one_step(step)
    if step == 1 or step % report_every == 0:
        report(step)
        if time_is_up():
            break
report(step, last=True)
print("DONE", rank, flush=True)
bps.shutdown()
