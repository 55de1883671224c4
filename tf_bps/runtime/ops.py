"""TensorFlow operations: push_pull (and Horovod's allreduce), broadcast, allgather and
their gradients.

The per-tensor work happens in the C++ kernel (custom_ops/tf) and the core; this
module only names tensors and builds ops.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import pickle
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import auto_control_deps

from tf_bps.runtime import basics, core
from tf_bps.runtime.compression import Compression, CoreCompressor
from tf_bps.runtime.process_sets import global_process_set, process_set_id, ranks_of

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
_library = _Library(tf.load_op_library(str(_path)))


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
_CORE_REDUCE_OP = {Sum: 0, Average: 1, Min: 2, Max: 3, Product: 4}


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


def _default_name(prefix: str, tensor: tf.Tensor, set_id: int = 0) -> str:
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


def _push_pull(tensor: tf.Tensor, name: str, op: ReduceOp, prescale_factor=1.0,
               postscale_factor=1.0, set_id: int = 0, compression: str = "") -> tf.Tensor:
    return _library.byteps_push_pull(tensor, tensor_name=name,
                                     reduce_op=_CORE_REDUCE_OP[ReduceOp(op)],
                                     prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor, process_set=set_id,
                                     compression=compression)


def set_compression_learning_rate(learning_rate):
    """Tells the core the learning rate of the step whose gradients are pushed next: a
    compressor with error feedback (Compression.topk(..., ef="vanilla"), ...) rescales
    what it left out of earlier steps when the rate changes, as BytePS does.
    DistributedOptimizer does this itself; a custom loop with DistributedGradientTape
    whose learning rate changes calls it each step before the tape's gradient(). In a
    graph it returns the op, which the step's push_pulls must depend on
    (tf.control_dependencies): they may otherwise run first."""
    # Not through _Library: the op belongs to no tensor's rounds.
    return _library._library.byteps_set_learning_rate(tf.cast(learning_rate, tf.float64))


def _async_push_pull(tensor: tf.Tensor, name: str) -> tf.Tensor:
    """BYTEPS_ENABLE_ASYNC: adds this worker's weight delta to the servers' copy of the
    parameters and returns that copy, waiting for no other worker. The first call on a
    name sends the initial value instead, and every worker receives rank 0's."""
    return _library.byteps_async_push_pull(tensor, tensor_name=name)


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
        name = name or _default_name("PushPull", tensor, set_id)
        return _push_pull(tensor, name, reduce_op, float(prescale_factor),
                          float(postscale_factor), set_id, compression.spec)
    if compression is not Compression.none:
        # Scale the full-precision values; the wire carries the compressed ones.
        tensor = _scale(tensor, prescale_factor)
        compressed, context = compression.compress(tensor)
        name = name or _default_name("PushPull", compressed, set_id)
        reduced = compression.decompress(
            _push_pull(compressed, name, reduce_op, set_id=set_id), context)
        return _scale(reduced, postscale_factor)
    name = name or _default_name("PushPull", tensor, set_id)
    return _push_pull(tensor, name, reduce_op, float(prescale_factor), float(postscale_factor),
                      set_id)


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
        with _placed(device_sparse):
            set_id = process_set_id(process_set)
            name = name or _default_name("IndexedSlices", tensor.values, set_id)
            return _allreduce_indexed_slices(tensor, name, reduce_op, set_id)
    with _placed(device_dense):
        return push_pull(tensor, name=name, compression=compression, op=reduce_op,
                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         process_set=process_set)


def _placed(device: str):
    """Horovod's device_dense / device_sparse: where the operation runs ("" = default)."""
    return tf.device(device) if device else contextlib.nullcontext()


def _scale(tensor: tf.Tensor, factor) -> tf.Tensor:
    """tensor * factor; integers are scaled in float64 and truncated, as the core does."""
    if isinstance(factor, (int, float)) and factor == 1:
        return tensor
    if tensor.dtype.is_floating or tensor.dtype.is_complex:
        return tensor * tf.cast(factor, tensor.dtype)
    return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)


def _allreduce_indexed_slices(grad: tf.IndexedSlices, name: str, op,
                              set_id: int) -> tf.IndexedSlices:
    """A sparse tensor stays sparse: the rows and indices of all workers, gathered."""
    values = _library.byteps_allgather(grad.values, tensor_name=f"{name}.values",
                                       process_set=set_id)
    indices = _library.byteps_allgather(grad.indices, tensor_name=f"{name}.indices",
                                        process_set=set_id)
    if op == Average:
        values = values / tf.cast(len(ranks_of(set_id)), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=grad.dense_shape)


def _attr_name(op) -> str:
    name = op.get_attr("tensor_name")
    return name.decode() if isinstance(name, bytes) else name


_REDUCE_OP_OF_CORE = {core: op for op, core in _CORE_REDUCE_OP.items()}


@tf.RegisterGradient("BytepsPushPull")
def _push_pull_gradient(op, grad):
    """Horovod's definition: the gradient of a sum (or average) over workers is the
    same reduction, with the same scale factors, of the workers' gradients."""
    reduce_op = _REDUCE_OP_OF_CORE[op.get_attr("reduce_op")]
    if reduce_op not in (Sum, Average):
        raise NotImplementedError(f"the gradient of a {reduce_op.name} push_pull is not "
                                  "defined (Horovod defines it for Sum and Average only)")
    return _push_pull(grad, f"{_attr_name(op)}.grad", reduce_op,
                      op.get_attr("prescale_factor"), op.get_attr("postscale_factor"),
                      op.get_attr("process_set"))


@tf.RegisterGradient("BytepsBroadcast")
def _broadcast_gradient(op, grad):
    """Horovod's definition: the root receives the average of every worker's gradient,
    the other ranks zeros (their input did not affect the result)."""
    averaged = _push_pull(grad, f"{_attr_name(op)}.grad", Average,
                          set_id=op.get_attr("process_set"))
    if basics.rank() != op.get_attr("root_rank"):
        return averaged * 0
    return averaged


@tf.RegisterGradient("BytepsAllgather")
def _allgather_gradient(op, grad):
    """Horovod's definition: average the gradient over workers, then each worker takes
    the rows that its own input contributed."""
    name, set_id = _attr_name(op), op.get_attr("process_set")
    averaged = _push_pull(grad, f"{name}.grad", Average, set_id=set_id)
    rows = tf.shape(op.inputs[0], out_type=tf.int64)[:1]
    all_rows = _library.byteps_allgather(rows, tensor_name=f"{name}.grad.rows",
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
    name = name or _default_name("Broadcast", tensor, set_id)
    return _library.byteps_broadcast(tensor, tensor_name=name, root_rank=root_rank,
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
    set_id = process_set_id(process_set)
    tensor = tf.convert_to_tensor(tensor)
    name = name or _default_name("Allgather", tensor, set_id)
    return _library.byteps_allgather(tensor, tensor_name=name, process_set=set_id)


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
    name = name or _default_name("Alltoall", tensor, set_id)
    received, received_splits = _library.byteps_alltoall(tensor, sizes, tensor_name=name,
                                                         process_set=set_id)
    return received if splits is None else (received, received_splits)


def reducescatter(tensor, op=Average, name: str | None = None, ignore_name_scope=False,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` across workers; each keeps its share of the first dimension
    (an even split, the first ranks taking one more row when it is uneven)."""
    set_id = process_set_id(process_set)
    reduce_op = _resolve_op(None, op)
    tensor = tf.convert_to_tensor(tensor)
    name = name or _default_name("Reducescatter", tensor, set_id)
    return _library.byteps_reducescatter(tensor, tensor_name=name,
                                         reduce_op=_CORE_REDUCE_OP[reduce_op],
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
    returned, _ = _library.byteps_alltoall(grad, op.outputs[1],
                                           tensor_name=f"{_attr_name(op)}.grad",
                                           process_set=op.get_attr("process_set"))
    return returned, None


@tf.RegisterGradient("BytepsReducescatter")
def _reducescatter_gradient(op, grad):
    """Horovod's definition: every worker's share of the gradient, gathered; for a Sum
    scaled by the number of workers, for an Average as it is (and by the scale
    factors, which Horovod's reducescatter does not have)."""
    reduce_op = _REDUCE_OP_OF_CORE[op.get_attr("reduce_op")]
    if reduce_op not in (Sum, Average):
        raise NotImplementedError(f"the gradient of a {reduce_op.name} reducescatter is not "
                                  "defined (Horovod defines it for Sum and Average only)")
    set_id = op.get_attr("process_set")
    gathered = _library.byteps_allgather(grad, tensor_name=f"{_attr_name(op)}.grad",
                                         process_set=set_id)
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    if reduce_op == Sum:
        scale *= len(ranks_of(set_id))
    return _scale(gathered, scale)


def barrier(process_set=global_process_set) -> None:
    """Returns once every worker of the set has called it (Horovod's barrier)."""
    set_id = process_set_id(process_set)
    _push_pull(tf.zeros([1], tf.int32), "Barrier" if set_id == 0 else f"Barrier.set{set_id}",
               Sum, set_id=set_id)


def join() -> tf.Tensor:
    """Horovod's join: this worker has no more data. Until every worker has joined,
    the others' operations go on without it (it contributes nothing: no summand, no
    rows; a broadcast from it fails); then every worker gets the last rank to join,
    as an int32 tensor. Eagerly, outside tf.function."""
    return tf.constant(core.worker_join(), tf.int32)


def _variable_name(variable) -> str:
    return getattr(variable, "path", None) or variable.name


def _assign_broadcasts(variables, root_rank: int, prefix: str, process_set) -> list:
    """Assigns `root_rank`'s value to each variable; returns the assign operations.
    The variables must be listed in the same order on every worker."""
    assigns = []
    for index, variable in enumerate(variables):
        value = broadcast(tf.convert_to_tensor(variable), root_rank,
                          name=f"{prefix}.{index}.{_variable_name(variable)}",
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
