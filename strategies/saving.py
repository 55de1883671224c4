"""Writing files under `tf_bps.ParameterServerStrategy`: saves are a step of the whole
job, and Keras's callbacks write once, not once per worker.

MultiWorkerMirroredStrategy makes every worker take part in a save (its variables are
read collectively), so TensorFlow's multi-worker tutorial has every worker call
`model.save`: the chief to the real path, the others to a temporary folder they delete,
after which every worker may load the real path. Nothing here is collective by nature,
so without help a worker would return from `save` and load while the chief is still
writing. `install()` makes these saves collective steps of the job (`_collective_save`):

  - `keras.Model.save` and `save_weights` of a model built under the strategy;
  - `tf.train.CheckpointManager.save` in a process that made the strategy.

Every worker returns only once every worker's file is complete, and each learns
whether the others' writes succeeded. Workers that name one destination do not write it
at once: for a Keras file only the lowest rank writes it (a file holds nothing of a
worker's own); a checkpoint manager's files are written in turn, lowest rank first, so
that every manager's bookkeeping (its save counter, its list of checkpoints) stays true.

The rest patches Keras 3's private methods (each says why):
  - BackupAndRestore saves and deletes its backup on rank 0 only, and a job of another
    size that resumes from it keeps the learning rate its script set;
  - TensorBoard's other workers log to a folder of their own, removed at the end.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import os
import shutil
import threading

import keras
import tensorflow as tf

from tf_bps.runtime import basics, ops

log = logging.getLogger("tf_bps")

# Set while this thread is inside a save that is already coordinated (or written by
# rank 0 alone on purpose): the saves it makes in turn are not coordinated again.
_inside = threading.local()
# Whether this process made a ParameterServerStrategy (see install()).
_strategy_made = False


def under_the_strategy(model) -> bool:
    """Whether `model` was built under a tf_bps strategy."""
    strategy = getattr(model, "distribute_strategy", None)
    return getattr(strategy, "synchronises_gradients_with_tf_bps", False)


def _on_a_worker_other_than_rank_0(callback, model=None) -> bool:
    """Whether `callback` (of `model`, or its own) runs on a worker other than rank 0 of
    a multi-worker job under the strategy."""
    model = model if model is not None else getattr(callback, "model", None)
    return under_the_strategy(model) and basics.size() > 1 and basics.rank() != 0


@contextlib.contextmanager
def _uncoordinated():
    """Saves made inside are this worker's alone."""
    outer = getattr(_inside, "active", False)
    _inside.active = True
    try:
        yield
    finally:
        _inside.active = outer


def _destination(path) -> str:
    path = os.fspath(path)
    return path if "://" in path else os.path.realpath(path)


def _collective_save(what: str, path, write, shared_writes_in_turn: bool):
    """Runs `write()` (which saves to `path`) as one step of every worker of the job.

    Every worker tells the others what it saves where; then in each turn the workers
    whose turn it is write, and all of them learn the outcome before the next turn.
    A worker that does not write (its destination is written by a lower rank, and
    `shared_writes_in_turn` is False) returns None."""
    if getattr(_inside, "active", False) or not basics.is_distributed():
        return write()
    with _uncoordinated():
        return _coordinated_save(what, _destination(path), write, shared_writes_in_turn)


def _coordinated_save(what, destination, write, shared_writes_in_turn):
    rank = basics.rank()
    try:
        plans = ops.allgather_object((what, destination), name="tf_bps.save.plan")
    except tf.errors.DeadlineExceededError as error:
        raise tf.errors.DeadlineExceededError(
            None, None,
            f"{what} under tf_bps.ParameterServerStrategy is a step of the whole job, as "
            "under MultiWorkerMirroredStrategy: every worker must call it (the chief with "
            "the real path, the others with a temporary one, or all with the same path); "
            f"not every worker did: {error.message}") from None
    kinds = {kind for kind, _ in plans}
    if len(kinds) > 1:
        raise ValueError(
            "the workers saved different things at once: "
            + "; ".join(f"rank {r}: {kind} to {where}" for r, (kind, where) in
                        enumerate(plans)))
    # My turn: how many lower ranks name my destination.
    turn = sum(1 for _, where in plans[:rank] if where == destination)
    turns = (max(collections.Counter(where for _, where in plans).values())
             if shared_writes_in_turn else 1)
    result = None
    for current in range(turns):
        failure = None
        if turn == current:
            try:
                result = write()
            except Exception as error:  # Told to everyone, then raised here.
                failure = error
        outcomes = ops.allgather_object(
            None if failure is None else f"{type(failure).__name__}: {failure}",
            name="tf_bps.save.outcome")
        if failure is not None:
            raise failure
        failed = [(r, message) for r, message in enumerate(outcomes) if message]
        if failed:
            raise RuntimeError(f"{what} failed on another worker: " + "; ".join(
                f"rank {r} ({plans[r][1]}): {message}" for r, message in failed))
    return result


def install() -> None:
    """Called by every ParameterServerStrategy made in this process."""
    global _strategy_made
    _strategy_made = True
    _install_once()


@functools.cache
def _install_once() -> None:
    _save_collectively()
    _backup_on_rank_0_only()
    _tensorboard_on_rank_0()


def _save_collectively() -> None:
    """Public methods, wrapped: Keras's and TensorFlow's savers do not coordinate."""
    keras.Model.save = _saving_collectively("model.save", keras.Model.save)
    keras.Model.save_weights = _saving_collectively("model.save_weights",
                                                    keras.Model.save_weights)

    manager_save = tf.train.CheckpointManager.save

    @functools.wraps(manager_save)
    def save_checkpoint(self, *args, **kwargs):
        if not _strategy_made:
            return manager_save(self, *args, **kwargs)
        return _collective_save("CheckpointManager.save", self.directory,
                                lambda: manager_save(self, *args, **kwargs), True)

    tf.train.CheckpointManager.save = save_checkpoint


def _saving_collectively(what: str, method):
    """A Model method that saves to its first argument, as a step of the job when the
    model was built under the strategy."""

    @functools.wraps(method)
    def collectively(self, filepath, *args, **kwargs):
        if not under_the_strategy(self):
            return method(self, filepath, *args, **kwargs)
        return _collective_save(what, filepath, lambda: method(self, filepath, *args, **kwargs),
                                False)

    return collectively


def _backup_on_rank_0_only() -> None:
    """Private (Keras 3): BackupAndRestore saves (and deletes) the same files on every
    worker, so two workers would write one file at once. Under the strategy only rank 0
    writes, alone (the backup is read when a later run starts, not during this one);
    every worker still reads the backup when training starts, so all of them resume
    from the same epoch. Rank 0 also notes the job's size in the backup's metadata, so
    that a job of another size that resumes from it keeps its own learning rate."""
    backup = keras.callbacks.BackupAndRestore
    save_model, load_model = backup._save_model, backup._load_model

    @functools.wraps(save_model)
    def save_noting_the_size(self):
        save_model(self)
        if under_the_strategy(self.model):
            # In Keras's own metadata file (which reads only its fields), so the backup
            # folder holds what it always holds.
            metadata = _backup_metadata(self)
            metadata[_WORKERS_FIELD] = basics.size()
            with open(self._training_metadata_path, "w") as written:
                json.dump(metadata, written)

    @functools.wraps(load_model)
    def load_at_this_size(self):
        optimizer = getattr(self.model, "optimizer", None)
        rate = getattr(optimizer, "_learning_rate", None)  # a variable, or a schedule
        asked = rate.numpy() if isinstance(rate, keras.Variable) else None
        load_model(self)
        written_by = _backup_metadata(self).get(_WORKERS_FIELD)
        if asked is None or not isinstance(written_by, int) or written_by == basics.size() or \
                not under_the_strategy(self.model):
            return
        # The backup holds the learning rate of a job of another size; the script set
        # the one it wants for this size (Horovod's scripts scale it by the workers).
        rate.assign(asked)
        if basics.rank() == 0:
            log.warning("BackupAndRestore: the backup in %s was written by a job of %d "
                        "worker(s), this one has %d: the optimizer keeps the learning rate "
                        "the script set (%g), not the backup's", self.backup_dir,
                        written_by, basics.size(), float(asked))

    backup._save_model, backup._load_model = save_noting_the_size, load_at_this_size
    for method in ("_save_model", "on_train_end"):
        original = getattr(backup, method)

        @functools.wraps(original)
        def on_rank_0(self, *args, _original=original, **kwargs):
            if _on_a_worker_other_than_rank_0(self):
                return None
            with _uncoordinated():
                return _original(self, *args, **kwargs)

        setattr(backup, method, on_rank_0)


# In a BackupAndRestore backup's metadata: the size of the job that wrote it.
_WORKERS_FIELD = "tf_bps_workers"


def _backup_metadata(callback) -> dict:
    """The backup's training metadata (Keras's: epoch and batch), {} without one."""
    try:
        with open(callback._training_metadata_path) as written:
            metadata = json.load(written)
    except (OSError, ValueError):
        return {}
    return metadata if isinstance(metadata, dict) else {}


def _tensorboard_on_rank_0() -> None:
    """Private (Keras 3): TensorBoard writes its event files under `log_dir` on every
    worker, so the job's log would hold one run per worker, interleaved. As
    MultiWorkerMirroredStrategy did under Keras 2 (and TensorFlow's multi-worker
    tutorial shows), the other workers write to `log_dir/workertemp_<rank>` instead,
    removed when training ends: rank 0's is the job's log."""
    tensorboard = keras.callbacks.TensorBoard
    set_model, on_train_end = tensorboard.set_model, tensorboard.on_train_end

    @functools.wraps(set_model)
    def set_model_on_rank_0(self, model):
        self._tf_bps_scratch = None
        if not _on_a_worker_other_than_rank_0(self, model):
            return set_model(self, model)
        log_dir = self.log_dir
        self.log_dir = os.path.join(log_dir, f"workertemp_{basics.rank()}")
        try:
            set_model(self, model)  # Its writers (the model summary's, say) go there.
        finally:
            self.log_dir = log_dir
        self._tf_bps_scratch = self._log_write_dir
        return None

    @functools.wraps(on_train_end)
    def on_train_end_removing_scratch(self, logs=None):
        on_train_end(self, logs)
        scratch = getattr(self, "_tf_bps_scratch", None)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    tensorboard.set_model = set_model_on_rank_0
    tensorboard.on_train_end = on_train_end_removing_scratch
