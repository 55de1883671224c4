"""Keras 3 callbacks with Horovod's semantics."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tf_bps.runtime import basics
from tf_bps.runtime.ops import Average, broadcast_variables, push_pull
from tf_bps.runtime.raw_ops import placed


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every worker continue from `root_rank`'s model and optimizer state.

    At the start of training it broadcasts every variable that exists then. Keras builds
    some models (a Sequential without an Input, a subclassed model) and most optimizers
    during the first batch; whatever appeared during that batch is broadcast at its end,
    as Horovod does, so every worker ends the first step with the root's state.
    `device` places the broadcasts, as in Horovod. `local_variables` (a variable or a
    list) are left as each worker has them: those a PartialDistributedOptimizer or
    register_local_var keeps local.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        # Never broadcast: counted as done from the start (ids: they outlive fit).
        self._broadcast = {id(v) for v in local_variables}
        self._first_batch_seen = False

    def on_train_begin(self, logs=None):
        self._first_batch_seen = False
        self._broadcast_new_variables()

    def on_train_batch_end(self, batch, logs=None):
        if not self._first_batch_seen:
            self._first_batch_seen = True
            self._broadcast_new_variables()

    def _broadcast_new_variables(self):
        variables = list(self.model.variables)
        if self.model.optimizer is not None:
            variables += list(self.model.optimizer.variables)
        new = [v for v in variables if id(v) not in self._broadcast]
        if new:
            with placed(self.device):
                broadcast_variables(new, self.root_rank)
            self._broadcast.update(id(v) for v in new)


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's logged metrics by their mean over all workers.

    Put it before callbacks that read the metrics (checkpoints, early stopping).
    `device` places the reductions, as in Horovod.
    """

    def __init__(self, device: str = ""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        for key in sorted(logs):  # Same order on every worker.
            value = logs[key]
            if isinstance(value, (int, float, np.number)) or tf.is_tensor(value):
                with placed(self.device):
                    averaged = push_pull(tf.constant(float(value), tf.float64), op=Average,
                                         name=f"MetricAverage.{key}")
                logs[key] = float(averaged.numpy())


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier(epoch)` for
    start_epoch <= epoch < end_epoch.

    `multiplier` is a number or a function of the epoch. With staircase=True the rate
    changes at epoch starts; otherwise at every batch, with the epoch as a fraction
    (epoch + batch / steps_per_epoch). With momentum_correction, a change of rate
    rescales the optimizer's momentum buffers by new_lr / old_lr, so the step after
    the change is as if the momentum had been accumulated at the new rate.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.current_epoch = None

    def _in_range(self, epoch) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
            if not self.steps_per_epoch:
                raise ValueError(
                    "staircase=False needs steps_per_epoch (it could not be read from fit)")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._set_lr(self.initial_lr * self.multiplier(epoch))

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or not self._in_range(self.current_epoch):
            return
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        self._set_lr(self.initial_lr * self.multiplier(epoch))

    def _set_lr(self, new_lr: float) -> None:
        optimizer = self.model.optimizer
        rate = optimizer.learning_rate
        if not isinstance(rate, keras.Variable) and not isinstance(rate, tf.Variable):
            raise ValueError(
                "learning-rate callbacks need a float learning rate, not a schedule")
        old_lr = float(keras.ops.convert_to_numpy(rate))
        if self.momentum_correction and old_lr > 0 and new_lr != old_lr:
            for momentum in getattr(optimizer, "momentums", None) or []:
                momentum.assign(momentum * (new_lr / old_lr))
        rate.assign(new_lr)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the rate from initial_lr / size to initial_lr over `warmup_epochs`
    (Goyal et al., "Accurate, Large Minibatch SGD"), adjusting it at every batch."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            # The rate reached at the end of this batch: hence the extra step.
            epoch += 1.0 / self.steps_per_epoch
            size = basics.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1 and self.verbose > 0:
            rate = keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {rate:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's BestModelCheckpoint: a ModelCheckpoint that saves only when `monitor`
    improves, from rank 0 only (under tf_bps.ParameterServerStrategy saving is a step
    of every worker and rank 0 writes).

    Horovod leaves `filepath` to its Spark estimator; here pass `filepath=` or set
    `callback.filepath` before training.
    """

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch", filepath=None):
        # ModelCheckpoint checks the file name's extension at once; a missing path is
        # refused when training begins instead.
        placeholder = "unset.weights.h5" if save_weights_only else "unset.keras"
        super().__init__(filepath=filepath or placeholder, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
        self.filepath = filepath

    def on_train_begin(self, logs=None):
        if not self.filepath:
            raise ValueError("BestModelCheckpoint has no filepath: pass filepath=... or set "
                             "callback.filepath before training")
        super().on_train_begin(logs)

    def _save_model(self, epoch, batch, logs):
        from tf_bps.strategies.saving import under_the_strategy

        if basics.rank() != 0 and not under_the_strategy(self.model):
            return
        super()._save_model(epoch, batch, logs)
