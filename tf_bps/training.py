"""Horovod-style training wrappers: DistributedOptimizer and DistributedGradientTape.

Keras 3 routes every update, in `model.fit` and in custom loops, through
`Optimizer.apply(grads, variables)` (`apply_gradients` calls it too); the hooks Horovod
overrode for tf.keras (`get_gradients`, `_aggregate_gradients`) are never called.
So the wrapper overrides `apply`: gradients are push_pulled first, and only the
synchronised ones reach the wrapped optimizer.
"""

from __future__ import annotations

import tensorflow as tf

from tf_bps import basics
from tf_bps.compression import Compression
from tf_bps.ops import Average, ReduceOp, Sum, _push_pull, allgather
from tf_bps.strategies import ParameterServerStrategy


def _variable_name(variable) -> str:
    return getattr(variable, "path", None) or getattr(variable, "name", None) or "tensor"


@tf.function
def _push_pull_group(tensors, names, op):
    """All push_pulls of one step in one graph, so they are in flight together."""
    return [_push_pull(t, n, ReduceOp(op)) for t, n in zip(tensors, names, strict=True)]


def synchronise_gradients(grads, names, compression=Compression.none, op=Average,
                          sparse_as_dense=False):
    """push_pulls every gradient (None stays None); `names` must be stable per step."""
    grads = list(grads)
    if not basics.is_distributed():
        return grads  # One worker: its gradients are the average already.
    results = [None] * len(grads)
    dense_index, dense_tensors, dense_names, contexts = [], [], [], []
    for index, (grad, name) in enumerate(zip(grads, names, strict=True)):
        if grad is None:
            continue
        if isinstance(grad, tf.IndexedSlices):
            if not sparse_as_dense:
                results[index] = _push_pull_indexed_slices(grad, name, op)
                continue
            grad = tf.convert_to_tensor(grad)
        compressed, context = compression.compress(grad)
        dense_index.append(index)
        dense_tensors.append(compressed)
        dense_names.append(name)
        contexts.append(context)
    if dense_tensors:
        if tf.executing_eagerly():
            summed = _push_pull_group(dense_tensors, tuple(dense_names), int(op))
        else:
            summed = [_push_pull(t, n, op) for t, n in zip(dense_tensors, dense_names,
                                                            strict=True)]
        for index, tensor, context in zip(dense_index, summed, contexts, strict=True):
            results[index] = compression.decompress(tensor, context)
    return results


def _push_pull_indexed_slices(grad: tf.IndexedSlices, name: str, op) -> tf.IndexedSlices:
    """A sparse gradient stays sparse: the rows and indices of all workers, gathered."""
    values = allgather(grad.values, name=f"{name}.values")
    indices = allgather(grad.indices, name=f"{name}.indices")
    if op == Average:
        values = values / tf.cast(basics.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=grad.dense_shape)


class _DistributedKerasOptimizer:
    """Mixed into a copy of the user's optimizer class (see DistributedOptimizer)."""

    def _bps_setup(self, prefix, compression, backward_passes_per_step, op, sparse_as_dense):
        self._bps_prefix = prefix
        self._bps_compression = compression
        self._bps_passes = backward_passes_per_step
        self._bps_op = op
        self._bps_sparse_as_dense = sparse_as_dense
        self._bps_accumulators = None
        self._bps_pass_count = None

    def apply(self, grads, trainable_variables=None):
        if isinstance(tf.distribute.get_strategy(), ParameterServerStrategy):
            raise ValueError(
                "bps.DistributedOptimizer inside ParameterServerStrategy would average the "
                "gradients twice: the strategy already synchronises them. Use the plain "
                "optimizer under the strategy.")
        grads = list(grads)
        if trainable_variables is None:
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                self.build(variables)
                self.built = True
        if self._bps_passes == 1:
            return super().apply(self._bps_synchronise(grads, variables), trainable_variables)
        return self._bps_accumulate_then_apply(grads, variables, trainable_variables)

    def _bps_synchronise(self, grads, variables):
        names = [f"{self._bps_prefix}.{_variable_name(v)}" for v in variables]
        return synchronise_gradients(grads, names, self._bps_compression, self._bps_op,
                                     self._bps_sparse_as_dense)

    def _bps_accumulate_then_apply(self, grads, variables, trainable_variables):
        """Adds local gradients for backward_passes_per_step calls, then synchronises
        their mean once and applies it; the calls in between change no weight."""
        if self._bps_accumulators is None:
            with tf.init_scope():
                self._bps_accumulators = [
                    tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                name=f"bps_accumulator_{i}") for i, v in enumerate(variables)]
                self._bps_pass_count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                                   name="bps_pass_count")
        for accumulator, grad in zip(self._bps_accumulators, grads, strict=True):
            if grad is not None:
                accumulator.assign_add(tf.convert_to_tensor(grad))
        count = self._bps_pass_count.assign_add(1)

        def synchronise_and_apply():
            passes = float(self._bps_passes)
            means = [None if g is None else tf.convert_to_tensor(a) / tf.cast(passes, a.dtype)
                     for a, g in zip(self._bps_accumulators, grads, strict=True)]
            super(_DistributedKerasOptimizer, self).apply(
                self._bps_synchronise(means, variables), trainable_variables)
            for accumulator in self._bps_accumulators:
                accumulator.assign(tf.zeros_like(accumulator))
            return tf.constant(True)

        return tf.cond(count % self._bps_passes == 0, synchronise_and_apply,
                       lambda: tf.constant(False))


class _DistributedLegacyOptimizer(tf.compat.v1.train.Optimizer):
    """For tf.compat.v1 graph code: synchronises in compute_gradients."""

    def __init__(self, optimizer, prefix, compression, op, sparse_as_dense):
        super().__init__(use_locking=False, name=prefix)
        self._optimizer = optimizer
        self._bps_args = (compression, op, sparse_as_dense)

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in grads_and_vars]
        names = [f"{self._name}.{_variable_name(v)}" for _, v in grads_and_vars]
        synced = synchronise_gradients(grads, names, *self._bps_args)
        return list(zip(synced, [v for _, v in grads_and_vars], strict=True))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, sparse_as_dense=False):
    """Wraps a Keras 3 (or tf.compat.v1) optimizer so that it applies gradients
    averaged (op=bps.Average) or summed (op=bps.Sum) over all workers.

    The result is an instance of a subclass of the optimizer's own class with the
    same name, module and config, so saved models reload without tf_bps.
    """
    if op not in (Average, Sum):
        raise ValueError(f"op must be bps.Average or bps.Sum, got {op!r}")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be an integer >= 1, got "
                         f"{backward_passes_per_step!r}")
    prefix = name or "DistributedOptimizer"
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise ValueError("backward_passes_per_step > 1 needs a Keras optimizer")
        return _DistributedLegacyOptimizer(optimizer, prefix, compression, op, sparse_as_dense)
    cls = optimizer.__class__
    distributed_cls = type(cls.__name__, (_DistributedKerasOptimizer, cls),
                           {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    wrapped = distributed_cls.from_config(optimizer.get_config())
    wrapped._bps_setup(prefix, compression, backward_passes_per_step, op, sparse_as_dense)
    return wrapped


class DistributedGradientTape:
    """Wraps a tf.GradientTape: `gradient()` returns gradients synchronised over all
    workers. Everything else is the wrapped tape's."""

    def __init__(self, tape, compression=Compression.none, op=Average, sparse_as_dense=False,
                 name="DistributedGradientTape"):
        self._tape = tape
        self._args = (compression, op, sparse_as_dense)
        self._prefix = name

    def __getattr__(self, attribute):
        return getattr(self._tape, attribute)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        names = [f"{self._prefix}.{i}.{_variable_name(s)}" for i, s in enumerate(flat_sources)]
        synced = synchronise_gradients(flat_grads, names, *self._args)
        return tf.nest.pack_sequence_as(grads, synced)
