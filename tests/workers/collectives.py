"""Every collective in every dtype, eagerly and in tf.function, plus their gradients;
saves the results to $TEST_OUT/rank<r>.npz for the test to check against numpy."""

import os

import numpy as np
import tensorflow as tf
from collective_cases import (
    NUMERIC,
    POSTSCALE,
    PRESCALE,
    REDUCTIONS,
    alltoall_rows,
    alltoall_splits,
    gather_rows,
    scatter_shape,
    value,
)

import tf_bps as bps

# Workers listed in TEST_TCP_WORKERS reach their servers over TCP, the others through
# shared memory: every round policy must mix both.
if os.environ["HOROVOD_RANK"] in os.environ.get("TEST_TCP_WORKERS", "").split(","):
    os.environ["BYTEPS_ENABLE_IPC"] = "0"
bps.init()
rank, size = bps.rank(), bps.size()
root = size - 1
OPS = {"sum": bps.Sum, "average": bps.Average, "min": bps.Min, "max": bps.Max,
       "product": bps.Product}
results = {}


def keep(tensor) -> np.ndarray:
    """npz cannot store bfloat16: it is kept as float32, which holds it exactly."""
    array = tensor.numpy()
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


def both_modes(key, fn, *args):
    """Runs fn eagerly and traced into a graph; both results are kept."""
    results[f"eager/{key}"] = keep(fn(*args))
    results[f"graph/{key}"] = keep(tf.function(fn)(*args))


for dtype in NUMERIC:
    x = tf.constant(value(dtype, rank))
    for reduction in REDUCTIONS:
        both_modes(f"{reduction}/{dtype}",
                   lambda t, r=reduction: bps.allreduce(t, op=OPS[r]), x)
    both_modes(f"scaled/{dtype}", lambda t: bps.allreduce(
        t, op=bps.Sum, prescale_factor=PRESCALE, postscale_factor=POSTSCALE), x)
for dtype in [*NUMERIC, "bool"]:
    x = tf.constant(value(dtype, rank))
    both_modes(f"broadcast/{dtype}", lambda t: bps.broadcast(t, root_rank=root), x)
    rows = tf.constant(value(dtype, rank, shape=(gather_rows(rank), 2)))
    both_modes(f"allgather/{dtype}", lambda t: bps.allgather(t), rows)
for dtype in NUMERIC:
    x = tf.constant(value(dtype, rank, shape=scatter_shape(size)))
    both_modes(f"reducescatter/{dtype}", lambda t: bps.reducescatter(t, op=bps.Sum), x)
    both_modes(f"reducescatter_average/{dtype}", lambda t: bps.reducescatter(t), x)
# Alltoall with uneven splits, an even split of a bool tensor, and grouped operations.
splits = alltoall_splits(rank, size)
for mode, fn in (("eager", bps.alltoall), ("graph", tf.function(bps.alltoall))):
    received, received_splits = fn(tf.constant(alltoall_rows(rank, size)), splits)
    results[f"{mode}/alltoall"] = received.numpy()
    results[f"{mode}/alltoall_splits"] = received_splits.numpy()
    # Without splits, as Horovod: only the received rows come back.
    received = fn(tf.constant(value("bool", rank, shape=(2 * size, 3))))
    results[f"{mode}/alltoall_even_bool"] = received.numpy()
    grouped = tf.function(bps.grouped_allreduce) if mode == "graph" else bps.grouped_allreduce
    first, second = grouped([tf.fill([3], rank + 1.0), tf.fill([2, 2], rank * 2)], op=bps.Sum)
    results[f"{mode}/grouped"] = np.concatenate([first.numpy().ravel(),
                                                 second.numpy().ravel().astype(np.float32)])
    scattered = bps.grouped_reducescatter([tf.ones([size * 2, 2]) * (rank + 1)], op=bps.Sum)
    results[f"{mode}/grouped_reducescatter"] = scattered[0].numpy()
results["broadcast_object"] = np.array(repr(bps.broadcast_object(
    {"from": rank, "items": list(range(rank + 3))}, root_rank=root)))
results["allgather_object"] = np.array(repr(bps.allgather_object(("rank", rank, "x" * rank))))
# Named, with every worker's rows empty but one, and a scalar broadcast.
results["allgather_named"] = bps.allgather(
    tf.ones([rank % 2, 3], tf.int32) * rank, name="sparse_rows").numpy()
results["broadcast_scalar"] = bps.broadcast(tf.constant(rank * 1.5), root, name="scalar").numpy()

# One unnamed eager allgather whose rows grow from call to call (servers must accept
# the longer pushes).
results["growing_allgather"] = np.concatenate([
    bps.allgather(tf.fill([rank + 1 + 5 * step, 3], step)).numpy().ravel()
    for step in range(3)])

# Horovod's smaller APIs.
first, second = bps.grouped_allgather([tf.fill([rank + 1], rank), tf.fill([1, 2], float(rank))])
results["grouped_allgather"] = np.concatenate([first.numpy().astype(np.float32),
                                               second.numpy().ravel()])
variable = tf.Variable(tf.fill([3], float(rank)))
results["broadcast_inplace"] = np.concatenate([bps.broadcast_([variable], root)[0].numpy(),
                                               variable.numpy()])
results["rank_ops"] = np.array([op().numpy() for op in (
    bps.rank_op, bps.size_op, bps.local_rank_op, bps.local_size_op, bps.process_set_included_op)])
refusals = []
slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([2, 2]))
for arguments in ({"op": bps.Min}, {"op": bps.Product}, {"prescale_factor": 2.0}):
    try:
        bps.allreduce(slices, **arguments)
        refusals.append("accepted")
    except NotImplementedError:
        refusals.append("NotImplementedError")
results["indexed_slices_refusals"] = np.array(refusals)
# TensorFlow 1 style graphs, run by the default session: object collectives, and the
# broadcast of every global variable (which eager code must not call).
try:
    bps.broadcast_global_variables(root)
    results["global_variables_eagerly"] = np.array("accepted")
except RuntimeError as error:
    results["global_variables_eagerly"] = np.array(str(error))
with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    results["graph_allgather_object"] = np.array(repr(bps.allgather_object({"r": rank})))
    results["graph_broadcast_object"] = np.array(repr(bps.broadcast_object({"from": rank}, root)))
    weights = tf.compat.v1.Variable(tf.fill([2], float(rank)))
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(bps.broadcast_global_variables(root))
    results["global_variables"] = session.run(weights)
# What bpslaunch tells each process, as horovodrun does.
results["horovod_variables"] = np.array([int(os.environ[f"HOROVOD_{name}"]) for name in (
    "RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")])

# Gradients, eagerly and in a graph (Horovod's definitions).
rows = gather_rows(rank)
gather_weights = tf.reshape(tf.range(sum(gather_rows(r) for r in range(size)) * 2,
                                     dtype=tf.float32), [-1, 2]) + 1.0
gathered_var = tf.Variable(tf.ones([rows, 2]))
broadcast_var = tf.Variable([1.0, 2.0])
scaled_var = tf.Variable([1.0, -1.0, 2.0])


alltoall_var = tf.Variable(tf.ones([sum(splits), 2]))
scatter_var = tf.Variable(tf.ones(scatter_shape(size)))


def gradients():
    with tf.GradientTape(persistent=True) as tape:
        alltoall_loss = tf.reduce_sum(bps.alltoall(alltoall_var, splits, name="g.alltoall")[0] *
                                      float(rank + 1))
        scatter_loss = tf.reduce_sum(bps.reducescatter(scatter_var, op=bps.Sum,
                                                       name="g.reducescatter") * float(rank + 1))
        gather_loss = tf.reduce_sum(bps.allgather(gathered_var, name="g.allgather") *
                                    gather_weights)
        broadcast_loss = tf.reduce_sum(bps.broadcast(broadcast_var, root, name="g.broadcast") *
                                       float(rank + 1))
        scaled_loss = tf.reduce_sum(bps.allreduce(
            scaled_var, op=bps.Sum, prescale_factor=2.0, postscale_factor=3.0,
            name="g.scaled") * float(rank + 1))
    return (tape.gradient(gather_loss, gathered_var),
            tape.gradient(broadcast_loss, broadcast_var),
            tape.gradient(scaled_loss, scaled_var),
            tape.gradient(alltoall_loss, alltoall_var),
            tape.gradient(scatter_loss, scatter_var))


for mode, fn in (("eager", gradients), ("graph", tf.function(gradients))):
    for key, grad in zip(("allgather", "broadcast", "scaled", "alltoall", "reducescatter"), fn(),
                         strict=True):
        results[f"grad/{mode}/{key}"] = grad.numpy()

try:
    bps.allreduce(tf.ones([2]), op=bps.Adasum)
except NotImplementedError as error:
    results["adasum_error"] = np.array(str(error))

np.savez(os.path.join(os.environ["TEST_OUT"], f"rank{rank}.npz"), **results)
print("DONE", rank, flush=True)
bps.shutdown()
