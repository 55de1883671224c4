"""The core's TensorFlow operations, called directly: each takes its tensor name and the
core's arguments as they are, with no defaults derived and no checks of a user's input.
ops.py builds the public API on them; the training layer builds its pipelines on them.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import weakref

import tensorflow as tf
from tensorflow.python.framework import auto_control_deps

from tf_bps.runtime import basics, core
from tf_bps.runtime.process_sets import ranks_of

_OP_TYPES = frozenset(("BytepsPushPull", "BytepsAsyncPushPull", "BytepsBroadcast",
                       "BytepsAllgather", "BytepsAlltoall", "BytepsReducescatter"))
# Private (TensorFlow 2.21): inside a tf.function, automatic control dependencies run
# every stateful op that takes no resource after the previous one has finished. Our ops
# are stateful (so that nothing folds, prunes or merges them), and chained that way a
# step's push_pulls would go out one at a time: no overlap, no priority. Listed here,
# they must still run, but in parallel; _Library orders only ops on the same tensor.
auto_control_deps.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS |= _OP_TYPES


class _Library:
    """The ops library; in a graph, each op on a tensor name runs after the previous op
    on that name (each is a round of that tensor, and every worker must number the
    rounds alike), while ops on different names run in parallel. Their priority is
    given when the graph is built, in program order: run in parallel, they would
    otherwise rank by which started first, which differs between workers, and workers
    pushing in different orders hold each other up at the servers."""

    def __init__(self, library):
        self._library = library
        self._last_op_by_tensor = weakref.WeakKeyDictionary()  # graph -> {name: op}

    def __getattr__(self, name):
        create = getattr(self._library, name)

        @tf.autograph.experimental.do_not_convert
        @functools.wraps(create)
        def in_round_order(*args, tensor_name="", **kwargs):
            outputs = create(*args, tensor_name=tensor_name, **kwargs)
            if tensor_name and not tf.executing_eagerly():
                if basics.is_initialized():
                    basics.declare([tensor_name])
                op = tf.nest.flatten(outputs)[0].op
                last = self._last_op_by_tensor.setdefault(op.graph, {})
                if tensor_name in last:
                    op._add_control_input(last[tensor_name])
                last[tensor_name] = op
            return outputs

        setattr(self, name, in_round_order)
        return in_round_order


try:
    _path = core.native_library("_bps_tf_ops")
except core.NotBuiltError:
    raise core.NotBuiltError(
        "tf_bps was built without TensorFlow, so it has no TensorFlow operations: with "
        "TensorFlow installed, build it again: pip install --no-build-isolation "
        "--force-reinstall 'tf_bps[tensorflow]'") from None
library = _Library(tf.load_op_library(str(_path)))


class ReduceOp(enum.IntEnum):
    """How push_pull combines the workers' tensors; Horovod's values, so that code
    comparing or passing them as integers keeps working."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average = ReduceOp.Average
Sum = ReduceOp.Sum
Adasum = ReduceOp.Adasum
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product

# The kernel's reduce_op attribute (the core's values).
CORE_REDUCE_OP = {Sum: 0, Average: 1, Min: 2, Max: 3, Product: 4}


REDUCE_OP_OF_CORE = {value: op for op, value in CORE_REDUCE_OP.items()}


def default_name(prefix: str, tensor: tf.Tensor, set_id: int = 0) -> str:
    """A name that is the same on every worker and in every step.

    In a graph (tf.function) it is the op's unique graph name, which tracing gives
    deterministically. Eager calls run one at a time, so unnamed ones are matched in
    call order under a name made of their dtype and shape: a loop reuses its keys.
    """
    if tf.executing_eagerly():
        # One name per kind: the core numbers the calls (rounds), so the k-th unnamed
        # call of every worker meets the others' k-th, and a shape or dtype that
        # differs between workers is reported at once instead of waiting forever.
        return f"{prefix}.eager" if set_id == 0 else f"{prefix}.eager.set{set_id}"
    return tf.compat.v1.get_default_graph().unique_name(prefix)


def push_pull(tensor: tf.Tensor, name: str, op: ReduceOp, prescale_factor=1.0,
               postscale_factor=1.0, set_id: int = 0, compression: str = "") -> tf.Tensor:
    return library.byteps_push_pull(tensor, tensor_name=name,
                                     reduce_op=CORE_REDUCE_OP[ReduceOp(op)],
                                     prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor, process_set=set_id,
                                     compression=compression)


def async_push_pull(tensor: tf.Tensor, name: str) -> tf.Tensor:
    """BYTEPS_ENABLE_ASYNC: adds this worker's weight delta to the servers' copy of the
    parameters and returns that copy, waiting for no other worker. The first call on a
    name sends the initial value instead, and every worker receives rank 0's."""
    return library.byteps_async_push_pull(tensor, tensor_name=name)


def allgather(tensor: tf.Tensor, name: str | None = None, set_id: int = 0) -> tf.Tensor:
    """Every worker's rows of `tensor` (of the set), concatenated in rank order."""
    name = name or default_name("Allgather", tensor, set_id)
    return library.byteps_allgather(tensor, tensor_name=name, process_set=set_id)


def placed(device: str):
    """Horovod's device_dense / device_sparse: where the operation runs ("" = default)."""
    return tf.device(device) if device else contextlib.nullcontext()


def scale(tensor: tf.Tensor, factor) -> tf.Tensor:
    """tensor * factor; integers are scaled in float64 and truncated, as the core does."""
    if isinstance(factor, (int, float)) and factor == 1:
        return tensor
    if tensor.dtype.is_floating or tensor.dtype.is_complex:
        return tensor * tf.cast(factor, tensor.dtype)
    return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)


def allreduce_indexed_slices(grad: tf.IndexedSlices, name: str, op,
                              set_id: int) -> tf.IndexedSlices:
    """A sparse tensor stays sparse: the rows and indices of all workers, gathered."""
    values = library.byteps_allgather(grad.values, tensor_name=f"{name}.values",
                                       process_set=set_id)
    indices = library.byteps_allgather(grad.indices, tensor_name=f"{name}.indices",
                                        process_set=set_id)
    if op == Average:
        values = values / tf.cast(len(ranks_of(set_id)), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=grad.dense_shape)


def set_compression_learning_rate(learning_rate):
    """Tells the core the learning rate of the step whose gradients are pushed next: a
    compressor with error feedback (Compression.topk(..., ef="vanilla"), ...) rescales
    what it left out of earlier steps when the rate changes, as BytePS does.
    DistributedOptimizer does this itself; a custom loop with DistributedGradientTape
    whose learning rate changes calls it each step before the tape's gradient(). In a
    graph it returns the op, which the step's push_pulls must depend on
    (tf.control_dependencies): they may otherwise run first."""
    # Not through _Library: the op belongs to no tensor's rounds.
    return library._library.byteps_set_learning_rate(tf.cast(learning_rate, tf.float64))


def variable_name(variable) -> str:
    """How gradients and broadcasts of a variable are named: its Keras path, else its
    name."""
    return getattr(variable, "path", None) or getattr(variable, "name", None) or "tensor"
