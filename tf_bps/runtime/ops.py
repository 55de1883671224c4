"""TensorFlow operations: push_pull (and Horovod's allreduce), broadcast, allgather and
their gradients.

The per-tensor work happens in the C++ kernel (custom_ops/tf) and the core; this
module only names tensors and builds ops.
"""

from __future__ import annotations

import pickle

import numpy as np
import tensorflow as tf

from tf_bps.runtime import basics, core, raw_ops
from tf_bps.runtime.compression import Compression, CoreCompressor
from tf_bps.runtime.process_sets import global_process_set, process_set_id, ranks_of
from tf_bps.runtime.raw_ops import (  # noqa: F401  (the API's names for them)
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    set_compression_learning_rate,
)


def _resolve_op(average: bool | None, op) -> ReduceOp:
    if op is not None and average is not None:
        raise ValueError("push_pull takes either `average` or `op`, not both")
    if op is None:
        return Sum if average is False else Average
    try:
        op = ReduceOp(op)
    except ValueError:
        raise ValueError(f"op={op!r} is not a reduce op: use bps.Average, bps.Sum, bps.Min, "
                         "bps.Max or bps.Product") from None
    if op == Adasum:
        # NotImplementedError, as Horovod raises where it lacks Adasum.
        raise NotImplementedError("op=bps.Adasum is not supported by tf_bps: its servers "
                                  "reduce with Average, Sum, Min, Max or Product")
    return op


def push_pull(tensor, average: bool | None = None, name: str | None = None,
              compression=Compression.none, op: ReduceOp | None = None,
              prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set) -> tf.Tensor:
    """Reduces `tensor` across all workers (default: average).

    `op` is bps.Average, Sum, Min, Max or Product. Workers match tensors by `name`;
    without one a stable name is derived. `prescale_factor` multiplies each worker's
    tensor before the reduction and `postscale_factor` the result.
    """
    reduce_op = _resolve_op(average, op)
    set_id = process_set_id(process_set)
    tensor = tf.convert_to_tensor(tensor)
    for argument, factor in (("prescale_factor", prescale_factor),
                             ("postscale_factor", postscale_factor)):
        if not isinstance(factor, (int, float)):
            raise ValueError(f"{argument}={factor!r} must be a number")
    if isinstance(compression, CoreCompressor):
        # The core compresses each partition on the way to the servers and back.
        name = name or raw_ops.default_name("PushPull", tensor, set_id)
        return raw_ops.push_pull(tensor, name, reduce_op, float(prescale_factor),
                                 float(postscale_factor), set_id, compression.spec)
    if compression is not Compression.none:
        # Scale the full-precision values; the wire carries the compressed ones.
        tensor = raw_ops.scale(tensor, prescale_factor)
        compressed, context = compression.compress(tensor)
        name = name or raw_ops.default_name("PushPull", compressed, set_id)
        reduced = compression.decompress(
            raw_ops.push_pull(compressed, name, reduce_op, set_id=set_id), context)
        return raw_ops.scale(reduced, postscale_factor)
    name = name or raw_ops.default_name("PushPull", tensor, set_id)
    return raw_ops.push_pull(tensor, name, reduce_op, float(prescale_factor),
                             float(postscale_factor), set_id)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Horovod's allreduce, with its arguments and defaults (average over all workers).

    `prescale_factor` multiplies each worker's tensor before the reduction and
    `postscale_factor` the result. A `tf.IndexedSlices` stays sparse: its rows and
    indices are gathered from every worker (and divided by the size for an average).
    `device_dense` / `device_sparse` place the operation, as in Horovod.
    """
    reduce_op = _resolve_op(average, op)
    if isinstance(tensor, tf.IndexedSlices):
        # As Horovod: only what gathering the rows can compute.
        if reduce_op not in (Sum, Average):
            raise NotImplementedError(f"allreduce of tf.IndexedSlices supports Sum and Average "
                                      f"only, not {reduce_op.name}; densify the gradient "
                                      "(tf.convert_to_tensor) to use it")
        for argument, factor in (("prescale_factor", prescale_factor),
                                 ("postscale_factor", postscale_factor)):
            if factor != 1.0:
                raise NotImplementedError(
                    f"{argument}={factor!r} is not supported for tf.IndexedSlices")
        with raw_ops.placed(device_sparse):
            set_id = process_set_id(process_set)
            name = name or raw_ops.default_name("IndexedSlices", tensor.values, set_id)
            return raw_ops.allreduce_indexed_slices(tensor, name, reduce_op, set_id)
    with raw_ops.placed(device_dense):
        return push_pull(tensor, name=name, compression=compression, op=reduce_op,
                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         process_set=process_set)


def _attr_name(op) -> str:
    name = op.get_attr("tensor_name")
    return name.decode() if isinstance(name, bytes) else name


@tf.RegisterGradient("BytepsPushPull")
def _push_pull_gradient(op, grad):
    """Horovod's definition: the gradient of a sum (or average) over workers is the
    same reduction, with the same scale factors, of the workers' gradients."""
    reduce_op = raw_ops.REDUCE_OP_OF_CORE[op.get_attr("reduce_op")]
    if reduce_op not in (Sum, Average):
        raise NotImplementedError(f"the gradient of a {reduce_op.name} push_pull is not "
                                  "defined (Horovod defines it for Sum and Average only)")
    return raw_ops.push_pull(grad, f"{_attr_name(op)}.grad", reduce_op,
                             op.get_attr("prescale_factor"), op.get_attr("postscale_factor"),
                             op.get_attr("process_set"))


@tf.RegisterGradient("BytepsBroadcast")
def _broadcast_gradient(op, grad):
    """Horovod's definition: the root receives the average of every worker's gradient,
    the other ranks zeros (their input did not affect the result)."""
    averaged = raw_ops.push_pull(grad, f"{_attr_name(op)}.grad", Average,
                                 set_id=op.get_attr("process_set"))
    if basics.rank() != op.get_attr("root_rank"):
        return averaged * 0
    return averaged


@tf.RegisterGradient("BytepsAllgather")
def _allgather_gradient(op, grad):
    """Horovod's definition: average the gradient over workers, then each worker takes
    the rows that its own input contributed."""
    name, set_id = _attr_name(op), op.get_attr("process_set")
    averaged = raw_ops.push_pull(grad, f"{name}.grad", Average, set_id=set_id)
    rows = tf.shape(op.inputs[0], out_type=tf.int64)[:1]
    all_rows = raw_ops.library.byteps_allgather(rows, tensor_name=f"{name}.grad.rows",
                                                process_set=set_id)
    ranks = ranks_of(set_id)
    return tf.split(averaged, all_rows, axis=0, num=len(ranks))[ranks.index(basics.rank())]


def broadcast(tensor, root_rank: int, name: str | None = None, ignore_name_scope=False,
              process_set=global_process_set) -> tf.Tensor:
    """Every worker gets `root_rank`'s value of `tensor`; only the root's data moves.
    `root_rank` is a global rank, also with a process set."""
    set_id = process_set_id(process_set)
    ranks = ranks_of(set_id)
    if root_rank not in ranks:
        where = f"process set {set_id}" if set_id else f"this job (size {basics.size()})"
        raise ValueError(f"root_rank={root_rank} is not a rank of {where}")
    tensor = tf.convert_to_tensor(tensor)
    name = name or raw_ops.default_name("Broadcast", tensor, set_id)
    return raw_ops.library.byteps_broadcast(tensor, tensor_name=name, root_rank=root_rank,
                                            process_set=set_id)


def allgather(tensor, name: str | None = None, ignore_name_scope=False,
              process_set=global_process_set) -> tf.Tensor:
    """Concatenates every worker's `tensor` along the first axis, in rank order.

    The first dimension may differ between workers; each worker's rows cross the
    network once to a server and once back to every worker.
    """
    gathered = _allgather(tensor, name, process_set)
    if basics.is_initialized() and basics.config().stacked_allgather:
        return _stacked(gathered, tensor, process_set)
    return gathered


def _allgather(tensor, name: str | None = None, process_set=global_process_set) -> tf.Tensor:
    return raw_ops.allgather(tf.convert_to_tensor(tensor), name, process_set_id(process_set))


def _stacked(gathered: tf.Tensor, tensor, process_set) -> tf.Tensor:
    """PERSEUS_CHANGE_HVD_ALLGATHER=0: a new first axis, one entry per worker (the
    layout of PyTorch DDP and mpi4py), which needs the same shape on every worker."""
    workers = len(ranks_of(process_set_id(process_set)))
    shape = tf.shape(tf.convert_to_tensor(tensor), out_type=tf.int64)
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.shape(gathered, out_type=tf.int64)[0], workers * shape[0],
            message="PERSEUS_CHANGE_HVD_ALLGATHER=0 stacks every worker's tensor, so their "
                    "first dimensions must agree")]):
        return tf.reshape(gathered, tf.concat([[workers], shape], 0))


def alltoall(tensor, splits=None, name: str | None = None, ignore_name_scope=False,
             process_set=global_process_set):
    """Sends `splits[r]` rows of `tensor` to each rank r and concatenates the rows every
    rank sent here, in rank order. As Horovod: with `splits`, returns (received rows,
    received splits); without, the first dimension is divided evenly (it must divide
    by the size) and only the received rows are returned.
    """
    set_id = process_set_id(process_set)
    tensor = tf.convert_to_tensor(tensor)
    sizes = tf.zeros([0], tf.int64) if splits is None else tf.cast(splits, tf.int64)
    name = name or raw_ops.default_name("Alltoall", tensor, set_id)
    received, received_splits = raw_ops.library.byteps_alltoall(tensor, sizes, tensor_name=name,
                                                                process_set=set_id)
    return received if splits is None else (received, received_splits)


def reducescatter(tensor, op=Average, name: str | None = None, ignore_name_scope=False,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` across workers; each keeps its share of the first dimension
    (an even split, the first ranks taking one more row when it is uneven)."""
    set_id = process_set_id(process_set)
    reduce_op = _resolve_op(None, op)
    tensor = tf.convert_to_tensor(tensor)
    name = name or raw_ops.default_name("Reducescatter", tensor, set_id)
    return raw_ops.library.byteps_reducescatter(tensor, tensor_name=name,
                                                reduce_op=raw_ops.CORE_REDUCE_OP[reduce_op],
                                                prescale_factor=float(prescale_factor),
                                                postscale_factor=float(postscale_factor),
                                                process_set=set_id)


def _group_names(name: str | None, prefix: str, tensors) -> list[str | None]:
    if name is None and not tf.executing_eagerly():
        return [None] * len(tensors)  # Graph names are unique and deterministic.
    base = name or f"{prefix}.eager"
    return [f"{base}.{index}" for index in range(len(tensors))]


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, name=None,
                      ignore_name_scope=False):
    """Horovod's grouped_allreduce: allreduce of every tensor of the list, all in flight
    at once (inside a tf.function they are one graph); returns the list of results."""
    names = _group_names(name, "GroupedAllreduce", tensors)
    return [allreduce(t, average=average, device_dense=device_dense,
                      device_sparse=device_sparse, compression=compression, op=op,
                      prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      name=n, process_set=process_set) for t, n in zip(tensors, names, strict=True)]


def grouped_reducescatter(tensors, op=Average, process_set=global_process_set,
                          prescale_factor=1.0, postscale_factor=1.0, name=None,
                          ignore_name_scope=False):
    """reducescatter of every tensor of the list, all in flight at once."""
    names = _group_names(name, "GroupedReducescatter", tensors)
    return [reducescatter(t, op=op, name=n, process_set=process_set,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor)
            for t, n in zip(tensors, names, strict=True)]


def _evaluate(tensor: tf.Tensor, session) -> np.ndarray:
    """A tensor's value: eagerly, or in a TF1-style graph through `session` (or the
    default session), as Horovod's object collectives do."""
    if tf.executing_eagerly():
        return tensor.numpy()
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise ValueError("object collectives in graph mode need a session: pass session= or "
                         "call them under a default session (or eagerly)")
    return session.run(tensor)


def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """allgather of every tensor of the list, all in flight at once."""
    names = _group_names(name, "GroupedAllgather", tensors)
    return [allgather(t, name=n, process_set=process_set)
            for t, n in zip(tensors, names, strict=True)]


def broadcast_object(obj, root_rank: int = 0, session=None, name: str | None = None,
                     process_set=global_process_set):
    """Any picklable object of `root_rank`, on every worker (eagerly, or in a graph
    through `session`)."""
    name = name or f"BroadcastObject.{type(obj).__name__}"
    payload = pickle.dumps(obj) if basics.rank() == root_rank else b""
    length = _evaluate(broadcast(tf.constant([len(payload)], tf.int64), root_rank,
                                 name=f"{name}.length", process_set=process_set), session)
    data = (tf.constant(list(payload), tf.uint8, shape=[len(payload)])
            if basics.rank() == root_rank else tf.zeros([int(length[0])], tf.uint8))
    received = _evaluate(broadcast(data, root_rank, name=f"{name}.data",
                                   process_set=process_set), session)
    return obj if basics.rank() == root_rank else pickle.loads(received.tobytes())


def allgather_object(obj, session=None, name: str | None = None,
                     process_set=global_process_set):
    """Every worker's picklable `obj`, as a list in rank order (eagerly, or in a graph
    through `session`)."""
    name = name or f"AllgatherObject.{type(obj).__name__}"
    payload = pickle.dumps(obj)
    lengths = _evaluate(_allgather(tf.constant([len(payload)], tf.int64), name=f"{name}.lengths",
                                  process_set=process_set), session)
    data = _evaluate(_allgather(tf.constant(list(payload), tf.uint8, shape=[len(payload)]),
                               name=f"{name}.data", process_set=process_set), session).tobytes()
    objects, offset = [], 0
    for length in lengths.tolist():
        objects.append(pickle.loads(data[offset:offset + length]))
        offset += length
    return objects


@tf.RegisterGradient("BytepsAlltoall")
def _alltoall_gradient(op, grad, _received_splits_grad):
    """Horovod's definition: the gradient rows go back where they came from."""
    returned, _ = raw_ops.library.byteps_alltoall(grad, op.outputs[1],
                                                  tensor_name=f"{_attr_name(op)}.grad",
                                                  process_set=op.get_attr("process_set"))
    return returned, None


@tf.RegisterGradient("BytepsReducescatter")
def _reducescatter_gradient(op, grad):
    """Horovod's definition: every worker's share of the gradient, gathered; for a Sum
    scaled by the number of workers, for an Average as it is (and by the scale
    factors, which Horovod's reducescatter does not have)."""
    reduce_op = raw_ops.REDUCE_OP_OF_CORE[op.get_attr("reduce_op")]
    if reduce_op not in (Sum, Average):
        raise NotImplementedError(f"the gradient of a {reduce_op.name} reducescatter is not "
                                  "defined (Horovod defines it for Sum and Average only)")
    set_id = op.get_attr("process_set")
    gathered = raw_ops.library.byteps_allgather(grad, tensor_name=f"{_attr_name(op)}.grad",
                                                process_set=set_id)
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    if reduce_op == Sum:
        scale *= len(ranks_of(set_id))
    return raw_ops.scale(gathered, scale)


def barrier(process_set=global_process_set) -> None:
    """Returns once every worker of the set has called it (Horovod's barrier)."""
    set_id = process_set_id(process_set)
    raw_ops.push_pull(tf.zeros([1], tf.int32), "Barrier" if set_id == 0 else f"Barrier.set{set_id}",
                      Sum, set_id=set_id)


def join() -> tf.Tensor:
    """Horovod's join: this worker has no more data. Until every worker has joined,
    the others' operations go on without it (it contributes nothing: no summand, no
    rows; a broadcast from it fails); then every worker gets the last rank to join,
    as an int32 tensor. Eagerly, outside tf.function."""
    return tf.constant(core.worker_join(), tf.int32)


def _assign_broadcasts(variables, root_rank: int, prefix: str, process_set) -> list:
    """Assigns `root_rank`'s value to each variable; returns the assign operations.
    The variables must be listed in the same order on every worker."""
    assigns = []
    for index, variable in enumerate(variables):
        value = broadcast(tf.convert_to_tensor(variable), root_rank,
                          name=f"{prefix}.{index}.{raw_ops.variable_name(variable)}",
                          process_set=process_set)
        assigns.append(variable.assign(value))
    return assigns


def broadcast_variables(variables, root_rank: int, process_set=global_process_set,
                        inplace=False):
    """Assigns `root_rank`'s values to `variables` on every worker (of the set)."""
    assigns = _assign_broadcasts(variables, root_rank, "Variable", process_set)
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_(variables, root_rank: int, name: str | None = None,
               process_set=global_process_set):
    """Horovod's in-place broadcast: `root_rank`'s values are assigned to `variables`
    on every worker; returns their new values."""
    assigns = _assign_broadcasts(variables, root_rank, name or "BroadcastInplace", process_set)
    with tf.control_dependencies(assigns):
        return [tf.identity(variable) for variable in variables]


def broadcast_global_variables(root_rank: int):
    """TensorFlow 1's graph-mode broadcast of every global variable (Horovod's API)."""
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() does not support eager execution: "
                           "use broadcast_variables(model.variables, root_rank) instead")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


# Horovod's *_op functions: the job's numbers as int32 tensors.
def rank_op(name=None) -> tf.Tensor:
    return tf.constant(basics.rank(), tf.int32, name=name)


def local_rank_op(name=None) -> tf.Tensor:
    return tf.constant(basics.local_rank(), tf.int32, name=name)


def size_op(process_set_id=0, name=None) -> tf.Tensor:
    return tf.constant(len(ranks_of(process_set_id)), tf.int32, name=name)


def local_size_op(name=None) -> tf.Tensor:
    return tf.constant(basics.local_size(), tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None) -> tf.Tensor:
    """1 if this worker belongs to the process set, else 0."""
    return tf.constant(int(basics.rank() in ranks_of(process_set_id)), tf.int32, name=name)
