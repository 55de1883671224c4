"""Horovod-style training wrappers: DistributedOptimizer and DistributedGradientTape.

Keras 3 routes every update, in `model.fit` and in custom loops, through
`Optimizer.apply(grads, variables)` (`apply_gradients` calls it too); the hooks Horovod
overrode for tf.keras (`get_gradients`, `_aggregate_gradients`) are never called.
So the wrapper overrides `apply`: gradients are push_pulled first, and only the
synchronised ones reach the wrapped optimizer. How they are synchronised is
gradient_sync.py's.
"""

from __future__ import annotations

import tensorflow as tf

from tf_bps.runtime import basics
from tf_bps.runtime.process_sets import global_process_set
from tf_bps.runtime.raw_ops import Average, variable_name
from tf_bps.training import loss_scale
from tf_bps.training.asynchronous import AsyncExchange
from tf_bps.training.compression import Compression
from tf_bps.training.gradient_sync import SyncOptions, _GradientSync


class _DistributedKerasOptimizer(_GradientSync):
    """Mixed into a copy of the user's optimizer class (see DistributedOptimizer)."""

    def _bps_setup(self, prefix, options, backward_passes_per_step,
                   average_aggregated_gradients, scale_local_gradients):
        self._bps_prefix = prefix
        self._bps_passes = backward_passes_per_step
        self._bps_average_passes = average_aggregated_gradients
        self._bps_accumulators = None
        self._bps_pass_count = None
        self._bps_exchange = AsyncExchange()
        self._bps_init_sync(options, prefix, scale_local_gradients)

    def register_local_var(self, var):
        """Keeps `var`'s gradient on this worker (Horovod's register_local_var)."""
        self._bps_register_local(var)

    def apply(self, grads, trainable_variables=None):
        # The strategy says so itself, so that training need not know the strategy.
        if getattr(tf.distribute.get_strategy(), "synchronises_gradients_with_tf_bps", False):
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
            return self._bps_update(grads, variables, trainable_variables)
        return self._bps_accumulate_then_apply(grads, variables, trainable_variables)

    def _bps_update(self, grads, variables, trainable_variables):
        """One step of the wrapped optimizer: on gradients synchronised over the workers,
        or (BYTEPS_ENABLE_ASYNC) on this worker's own, with the changed weights then
        exchanged with the servers (asynchronous.py)."""
        apply = super().apply
        options = self._bps_options
        if not (options.asynchronous and options.synchronises_here()):
            result = apply(self._bps_synchronise(grads, variables), trainable_variables)
            self._bps_step_done([tf.convert_to_tensor(v) for v in variables])
            return result
        stepped = [v for v, g in zip(variables, grads, strict=True)
                   if g is not None and not self._bps_is_local(v)]
        copies = [[v] for v in stepped]
        names = [f"{self._bps_prefix}.async.{variable_name(v)}" for v in stepped]
        before = AsyncExchange.snapshot(copies)
        apply(grads, trainable_variables)
        self._bps_exchange.exchange(copies, before, names)
        return None

    def _bps_synchronise(self, grads, variables):
        names = [f"{self._bps_prefix}.{variable_name(v)}" for v in variables]
        # The rate this step applies (a schedule's value at this step).
        return self._bps_sync(grads, variables, names, learning_rate=self.learning_rate)

    def _bps_accumulate_then_apply(self, grads, variables, trainable_variables):
        """Adds local gradients for backward_passes_per_step calls, then synchronises
        their sum (their mean with average_aggregated_gradients=True) once and applies
        it; the calls in between change no weight. `iterations` counts every call, as
        Horovod's does, so that a learning-rate schedule runs at the pace it would there."""
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
            divisor = float(self._bps_passes if self._bps_average_passes else 1)
            aggregated = [None if g is None else tf.convert_to_tensor(a) / tf.cast(divisor,
                                                                                   a.dtype)
                          for a, g in zip(self._bps_accumulators, grads, strict=True)]
            self._bps_update(aggregated, variables, trainable_variables)
            for accumulator in self._bps_accumulators:
                accumulator.assign(tf.zeros_like(accumulator))
            return tf.constant(True)

        def count_the_pass():
            self.iterations.assign_add(1)  # the wrapped optimizer's apply counts the others
            return tf.constant(False)

        return tf.cond(count % self._bps_passes == 0, synchronise_and_apply, count_the_pass)


class _DistributedLegacyOptimizer(tf.compat.v1.train.Optimizer, _GradientSync):
    """For tf.compat.v1 graph code: synchronises in compute_gradients."""

    def __init__(self, optimizer, prefix, options, use_locking, scale_local_gradients):
        super().__init__(use_locking=use_locking, name=prefix)
        self._optimizer = optimizer
        self._bps_init_sync(options, prefix, scale_local_gradients)

    def register_local_var(self, var):
        self._bps_register_local(var)

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        names = [f"{self._name}.{variable_name(v)}" for v in variables]
        synced = self._bps_sync(grads, variables, names)
        return list(zip(synced, variables, strict=True))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=None, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True,
                         compression_params=None):
    """Wraps a Keras 3 (or tf.compat.v1) optimizer so that it applies gradients
    averaged (op=bps.Average) or summed (op=bps.Sum) over all workers.

    Takes every argument of Horovod's DistributedOptimizer (horovod.tensorflow and
    horovod.tensorflow.keras) with its default. `backward_passes_per_step=N` adds N
    local gradients before one synchronisation (their mean with
    average_aggregated_gradients=True). `compression` may be one of BytePS's
    compressors (bps.Compression.topk(...) and the like), or `compression_params`
    BytePS's dict for one (Compression.from_params). The result is an instance of a
    subclass of the optimizer's own class with the same name, module and config, so
    saved models reload without tf_bps.
    """
    options = SyncOptions.from_arguments(compression, op, sparse_as_dense,
                                         gradient_predivide_factor, device_dense,
                                         device_sparse, num_groups, groups, process_set,
                                         compression_params)
    if backward_passes_per_step is None:  # 1, or AIACC's PERSEUS_ACCUMULATE_N_STEPS
        backward_passes_per_step = basics.config().accumulate_steps
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be an integer >= 1, got "
                         f"{backward_passes_per_step!r}")
    if not isinstance(average_aggregated_gradients, bool):
        raise ValueError("average_aggregated_gradients must be a bool, got "
                         f"{average_aggregated_gradients!r}")
    if not isinstance(use_locking, bool):
        raise ValueError(f"use_locking must be a bool, got {use_locking!r}")
    prefix = name or "DistributedOptimizer"
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise ValueError(f"backward_passes_per_step={backward_passes_per_step} needs a "
                             "Keras optimizer, not a tf.compat.v1 one")
        options.refuse_asynchronous("a tf.compat.v1 optimizer")
        settings = basics.config().gradient_step_options()
        if settings:
            raise ValueError(f"{', '.join(settings)} needs a Keras optimizer or "
                             "DistributedGradientTape, not a tf.compat.v1 optimizer")
        return _DistributedLegacyOptimizer(optimizer, prefix, options, use_locking,
                                           scale_local_gradients)
    if use_locking:
        raise ValueError("use_locking=True applies to tf.compat.v1 optimizers only; Keras "
                         "optimizers have no locking option")
    if isinstance(optimizer, _DistributedKerasOptimizer):
        raise ValueError("the optimizer is already a bps.DistributedOptimizer")
    loss_scale.install()  # a LossScaleOptimizer around it must skip steps on every worker
    wrapped = _distributed_class(type(optimizer)).from_config(optimizer.get_config())
    wrapped._bps_setup(prefix, options, backward_passes_per_step,
                       average_aggregated_gradients, scale_local_gradients)
    return wrapped


def _distributed_class(cls):
    """A subclass of a Keras optimizer class that keeps its name and module, so that
    what is saved with it is exactly what the plain optimizer would save."""
    return type(cls.__name__, (_DistributedKerasOptimizer, cls),
                {"__module__": cls.__module__, "__qualname__": cls.__qualname__})


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """Loads a saved Keras model whose optimizer then synchronises like a
    bps.DistributedOptimizer, with its saved state (slots, iterations) intact.

    `custom_optimizers`: optimizer classes the model may use that Keras does not know;
    `custom_objects`: as for keras.models.load_model.
    """
    import keras

    objects = {cls.__name__: cls for cls in custom_optimizers or []}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.Optimizer) and not isinstance(
            optimizer, _DistributedKerasOptimizer):
        # The loaded instance becomes the distributed one in place: same object, same
        # variables, only the class gains the synchronising `apply`.
        optimizer.__class__ = _distributed_class(type(optimizer))
        optimizer._bps_setup("DistributedOptimizer", SyncOptions.from_arguments(compression),
                             1, False, True)
    return model


def _layers(local_layers) -> list:
    """Horovod's `local_layers` argument: None, a Keras layer, or a list of them."""
    import keras

    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        return [local_layers]
    layers = list(local_layers)
    strangers = [layer for layer in layers if not isinstance(layer, keras.layers.Layer)]
    if strangers:
        raise ValueError(f"local_layers must be Keras layers; got {strangers[0]!r}")
    return layers


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False,
                                backward_passes_per_step=1, op=Average,
                                gradient_predivide_factor=1.0,
                                average_aggregated_gradients=False, groups=None,
                                process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True, compression_params=None):
    """A DistributedOptimizer whose `local_layers` (a Keras layer or a list) keep their
    gradients on this worker (scaled by 1/size when scale_local_gradients): model
    parallel parts of a model, as Horovod's PartialDistributedOptimizer."""
    layers = _layers(local_layers)
    wrapped = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients,
        compression_params=compression_params)
    wrapped._bps_register_local_layers(layers)
    return wrapped


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True,
                                   compression_params=None):
    """A DistributedGradientTape whose `local_layers` keep their gradients on this worker
    (scaled by 1/size when scale_local_gradients), as Horovod's."""
    layers = _layers(local_layers)
    tape = DistributedGradientTape(
        gradtape, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
        compression_params=compression_params)
    tape._bps_register_local_layers(layers)
    return tape


# A DistributedGradientTape is usually made anew for each step (Horovod's examples make
# it inside the step function), so what down-sampling and the step-time check carry from
# step to step lives here, by the tape's name and settings.
_TAPE_STEP_STATE: dict[tuple, tuple] = {}


class DistributedGradientTape(_GradientSync):
    """Wraps a tf.GradientTape: `gradient()` returns gradients synchronised over all
    workers. Takes every argument of Horovod's DistributedGradientTape, and BytePS's
    compressors as DistributedOptimizer does (`compression` or `compression_params`);
    everything else is the wrapped tape's."""

    def __init__(self, gradtape, device_dense="", device_sparse="",
                 compression=Compression.none, sparse_as_dense=False, op=Average,
                 gradient_predivide_factor=1.0, num_groups=0, groups=None,
                 process_set=global_process_set, scale_local_gradients=True,
                 name="DistributedGradientTape", compression_params=None):
        self._tape = gradtape
        options = SyncOptions.from_arguments(
            compression, op, sparse_as_dense, gradient_predivide_factor, device_dense,
            device_sparse, num_groups, groups, process_set, compression_params)
        options.refuse_asynchronous("DistributedGradientTape")
        self._prefix = name
        self._bps_init_sync(options, name, scale_local_gradients)
        key = (name, options.downsample, options.gradient_momentum, options.perf_check_steps)
        self._bps_sampler, self._bps_step_check = _TAPE_STEP_STATE.setdefault(
            key, (self._bps_sampler, self._bps_step_check))

    def register_local_source(self, source):
        """Keeps `source`'s gradient on this worker (Horovod's register_local_source)."""
        self._bps_register_local(source)

    def __getattr__(self, attribute):
        return getattr(self._tape, attribute)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        """The wrapped tape's gradients, synchronised. Workers match them by position and
        variable name; `use_generic_names=True` (Horovod's) matches by position only, for
        variables whose names differ between workers."""
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        names = [f"{self._prefix}.{i}" if use_generic_names
                 else f"{self._prefix}.{i}.{variable_name(s)}"
                 for i, s in enumerate(flat_sources)]
        synced = self._bps_sync(flat_grads, flat_sources, names)
        self._bps_step_done([g for g in synced
                             if g is not None and not isinstance(g, tf.IndexedSlices)])
        return tf.nest.pack_sequence_as(grads, synced)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """gradient(), split as Horovod's: ([(local source, its gradient)], [(other
        source, its synchronised gradient)]), each in the order of `sources`."""
        sources = tf.nest.flatten(sources)
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        pairs = list(zip(sources, grads, strict=True))
        return ([pair for pair in pairs if self._bps_is_local(pair[0])],
                [pair for pair in pairs if not self._bps_is_local(pair[0])])
