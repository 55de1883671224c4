"""Elastic training in Keras scripts (`horovod.tensorflow.keras.elastic`): the model's
state and the callbacks that keep it current and committed during `model.fit`."""

from __future__ import annotations

import keras

from tf_bps.training.elastic import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    InternalError,
    ObjectState,
    TensorFlowKerasState,
    run,
)
from tf_bps.training.preemption import on_preemption


class KerasState(TensorFlowKerasState):
    """A Keras model's and optimizer's variables, and attributes (epoch=0, batch=0)."""

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits `state` every `batches_per_commit` batches and at each epoch's end."""

    def __init__(self, state, batches_per_commit: int = 1):
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit={batches_per_commit}: want 1 or more")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def commit(self) -> None:
        self.state.commit()

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps `state.batch` at the last batch finished in the epoch (0 at its end)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        # After a restore the epoch resumes: it has the batches left to run.
        steps = (self.params or {}).get("steps")
        if steps:
            if self.steps_per_epoch is None:
                self.steps_per_epoch = steps
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps `state.epoch` at the number of epochs finished."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["CommitStateCallback", "HorovodInternalError", "HostsUpdatedInterrupt", "InternalError",
           "KerasState", "ObjectState", "UpdateBatchStateCallback", "UpdateEpochStateCallback",
           "run"]


class PreemptionCheckpointCallback(keras.callbacks.Callback):
    """Saves the model to `filepath` (`model.save`, or `save_weights` with
    `weights_only`) in a worker that leaves an elastic job after a preemption notice
    (SIGTERM), with the state of the commit where it leaves, before its process exits.
    Give it to `model.fit` with the CommitStateCallback."""

    def __init__(self, filepath: str, weights_only: bool = False):
        super().__init__()
        self.filepath, self.weights_only = filepath, weights_only
        on_preemption(self._save)

    def _save(self, state) -> None:
        if self.model is not None:
            (self.model.save_weights if self.weights_only else self.model.save)(self.filepath)
