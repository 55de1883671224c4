"""TensorFlow operations: push_pull (and Horovod's allreduce), broadcast, allgather and
their gradients.

The per-tensor work happens in the C++ kernel (custom_ops/tf) and the core; this
module only names tensors and builds ops.
"""

from __future__ import annotations

import contextlib
import enum

import tensorflow as tf

from tf_bps import basics, core
from tf_bps.compression import Compression
from tf_bps.process_sets import check_process_set, global_process_set

_library = tf.load_op_library(str(core.native_library("_bps_tf_ops")))


class ReduceOp(enum.IntEnum):
    """How push_pull combines the workers' tensors (values are the kernel's attr)."""

    Sum = 0
    Average = 1


Sum = ReduceOp.Sum
Average = ReduceOp.Average


def _resolve_op(average: bool | None, op: ReduceOp | None) -> ReduceOp:
    if op is not None and average is not None:
        raise ValueError("push_pull takes either `average` or `op`, not both")
    if op is not None:
        if op not in (Sum, Average):
            raise ValueError(f"push_pull op must be bps.Sum or bps.Average, got {op!r}")
        return ReduceOp(op)
    return Sum if average is False else Average


def _default_name(prefix: str, tensor: tf.Tensor) -> str:
    """A name that is the same on every worker and in every step.

    In a graph (tf.function) it is the op's unique graph name, which tracing gives
    deterministically. Eager calls run one at a time, so unnamed ones are matched in
    call order under a name made of their dtype and shape: a loop reuses its keys.
    """
    if tf.executing_eagerly():
        dims = "x".join(str(d) for d in tensor.shape.as_list()) or "scalar"
        return f"{prefix}.eager.{tensor.dtype.name}.{dims}"
    return tf.compat.v1.get_default_graph().unique_name(prefix)


def _push_pull(tensor: tf.Tensor, name: str, op: ReduceOp) -> tf.Tensor:
    return _library.byteps_push_pull(tensor, tensor_name=name, reduce_op=int(op))


def push_pull(tensor, average: bool | None = None, name: str | None = None,
              compression=Compression.none, op: ReduceOp | None = None) -> tf.Tensor:
    """Sums or averages `tensor` across all workers (default: average).

    Workers match tensors by `name`; without one a stable name is derived.
    """
    reduce_op = _resolve_op(average, op)
    tensor = tf.convert_to_tensor(tensor)
    compressed, context = compression.compress(tensor)
    name = name or _default_name("PushPull", compressed)
    return compression.decompress(_push_pull(compressed, name, reduce_op), context)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Horovod's allreduce, with its arguments and defaults (average over all workers).

    `prescale_factor` multiplies each worker's tensor before the reduction and
    `postscale_factor` the result. A `tf.IndexedSlices` stays sparse: its rows and
    indices are gathered from every worker (and divided by the size for an average).
    `device_dense` / `device_sparse` place the operation, as in Horovod.
    """
    check_process_set(process_set)
    reduce_op = _resolve_op(average, op)
    if isinstance(tensor, tf.IndexedSlices):
        for argument, factor in (("prescale_factor", prescale_factor),
                                 ("postscale_factor", postscale_factor)):
            if factor != 1.0:
                raise ValueError(f"{argument}={factor!r} is not supported for tf.IndexedSlices")
        with _placed(device_sparse):
            name = name or _default_name("IndexedSlices", tensor.values)
            return _allreduce_indexed_slices(tensor, name, reduce_op)
    with _placed(device_dense):
        tensor = _scale(tf.convert_to_tensor(tensor), prescale_factor, "prescale_factor")
        reduced = push_pull(tensor, name=name, compression=compression, op=reduce_op)
        return _scale(reduced, postscale_factor, "postscale_factor")


def _placed(device: str):
    """Horovod's device_dense / device_sparse: where the operation runs ("" = default)."""
    return tf.device(device) if device else contextlib.nullcontext()


def _scale(tensor: tf.Tensor, factor, argument: str) -> tf.Tensor:
    if isinstance(factor, (int, float)) and factor == 1:
        return tensor
    if not (tensor.dtype.is_floating or tensor.dtype.is_complex):
        raise ValueError(f"{argument}={factor!r} needs a floating-point tensor, not "
                         f"{tensor.dtype.name}")
    return tensor * tf.cast(factor, tensor.dtype)


def _allreduce_indexed_slices(grad: tf.IndexedSlices, name: str, op) -> tf.IndexedSlices:
    """A sparse tensor stays sparse: the rows and indices of all workers, gathered."""
    values = allgather(grad.values, name=f"{name}.values")
    indices = allgather(grad.indices, name=f"{name}.indices")
    if op == Average:
        values = values / tf.cast(basics.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=grad.dense_shape)


@tf.RegisterGradient("BytepsPushPull")
def _push_pull_gradient(op, grad):
    """The gradient of a sum (or mean) over workers is the sum (or mean) of the
    workers' gradients."""
    name = op.get_attr("tensor_name")
    if isinstance(name, bytes):
        name = name.decode()
    return _push_pull(grad, f"{name}.grad", ReduceOp(op.get_attr("reduce_op")))


def broadcast(tensor, root_rank: int, name: str | None = None) -> tf.Tensor:
    """Every worker gets `root_rank`'s value of `tensor`."""
    size = basics.size()
    if not 0 <= root_rank < size:
        raise ValueError(f"root_rank={root_rank} is not a rank of this job (size {size})")
    tensor = tf.convert_to_tensor(tensor)
    name = f"Broadcast.{name}" if name else _default_name("Broadcast", tensor)
    if size == 1:
        return tf.identity(tensor)
    wire = tf.cast(tensor, tf.int32) if tensor.dtype == tf.bool else tensor
    # A sum where only the root contributes non-zeros is the root's value, exactly.
    contribution = wire if basics.rank() == root_rank else tf.zeros_like(wire)
    result = _push_pull(contribution, name, Sum)
    return tf.cast(result, tf.bool) if tensor.dtype == tf.bool else result


def allgather(tensor, name: str | None = None) -> tf.Tensor:
    """Concatenates every worker's `tensor` along the first axis, in rank order.

    The first dimension may differ between workers. Built from two push_pulls: one
    for the row counts, one where each worker fills only its own rows.
    """
    tensor = tf.convert_to_tensor(tensor)
    size, rank = basics.size(), basics.rank()
    if size == 1:
        return tf.identity(tensor)
    name = f"Allgather.{name}" if name else _default_name("Allgather", tensor)
    rows = tf.shape(tensor, out_type=tf.int64)[0]
    counts = _push_pull(tf.one_hot(rank, size, dtype=tf.int64) * rows, f"{name}.rows", Sum)
    before = tf.reduce_sum(counts[:rank])
    after = tf.reduce_sum(counts) - before - rows
    padding = tf.concat([[[before, after]], tf.zeros([tf.rank(tensor) - 1, 2], tf.int64)], 0)
    wire = tf.cast(tensor, tf.int32) if tensor.dtype == tf.bool else tensor
    gathered = _push_pull(tf.pad(wire, padding), name, Sum)
    return tf.cast(gathered, tf.bool) if tensor.dtype == tf.bool else gathered


def _variable_name(variable) -> str:
    return getattr(variable, "path", None) or variable.name


def broadcast_variables(variables, root_rank: int):
    """Assigns `root_rank`'s values to `variables` on every worker.

    The variables must be listed in the same order on every worker.
    """
    assigns = []
    for index, variable in enumerate(variables):
        value = broadcast(tf.convert_to_tensor(variable), root_rank,
                          name=f"Variable.{index}.{_variable_name(variable)}")
        assigns.append(variable.assign(value))
    if tf.executing_eagerly():
        return None
    return tf.group(*assigns)
