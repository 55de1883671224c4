"""Pushes every case of cases.py eagerly and in tf.function, and many tensors at once;
saves what it got back to $TEST_OUT/rank<r>.npz."""

import os

import numpy as np
import tensorflow as tf
from cases import cases, value

import tf_bps as bps

# Workers listed in TEST_TCP_WORKERS reach their servers over TCP while the others use
# shared memory: the servers must mix both in one round.
if os.environ["HOROVOD_RANK"] in os.environ.get("TEST_TCP_WORKERS", "").split(","):
    os.environ["BYTEPS_ENABLE_IPC"] = "0"
bps.init()
rank, size = bps.rank(), bps.size()
results = {}


def save(key, tensor):
    array = tensor.numpy()
    results[key] = array.astype(np.float64) if array.dtype.kind == "V" or str(
        array.dtype) == "bfloat16" else array


for case, dtype, shape in cases():
    x = tf.constant(value(case, dtype, shape, rank))
    save(f"sum/{case}", bps.push_pull(x, name=f"sum/{case}", op=bps.Sum))
    save(f"avg/{case}", bps.push_pull(x, average=True, name=f"avg/{case}"))


@tf.function
def unnamed_in_graph(a, b):
    # No names given: derived from the graph, stable across calls.
    return bps.push_pull(a, op=bps.Sum), bps.push_pull(b, average=False)


for step in range(3):
    a = tf.fill([5], float(rank + step))
    b = tf.fill([2, 2], rank * 10 + step)
    got_a, got_b = unnamed_in_graph(a, b)
    save(f"graph/a{step}", got_a)
    save(f"graph/b{step}", got_b)

# Many tensors in flight at once: one graph whose push_pulls run concurrently.
many = [tf.fill([1000 + i], float(rank + i)) for i in range(40)]


@tf.function
def all_at_once(tensors):
    return [bps.push_pull(t, op=bps.Sum, name=f"many/{i}") for i, t in enumerate(tensors)]


for i, out in enumerate(all_at_once(many)):
    save(f"many/{i}", out)

# Eager unnamed calls in a loop reuse one name per dtype and shape.
for step in range(3):
    save(f"eager_unnamed/{step}", bps.push_pull(tf.fill([4], float(rank + step)), op=bps.Sum))

np.savez(os.path.join(os.environ["TEST_OUT"], f"rank{rank}.npz"), **results)
bps.shutdown()
