"""Elastic training, as Horovod's `hvd.elastic` has it: state that is committed in
memory, restored after a failure and synced from rank 0, and `run`, which calls the
training function again after the job re-forms.

A State keeps what a worker needs to go on from its last commit: `commit()` saves it
(and checks whether the job's hosts changed), `restore()` brings back what was
committed, `sync()` makes every worker equal to rank 0. Attributes given as keyword
arguments (epoch=0, batch=0, ...) are tracked the same way.

`run` calls the training function with the state synced from rank 0. A collective
broken by a lost peer raises InternalError, a change of hosts HostsUpdatedInterrupt;
`run` restores the last commit after the first, and then re-forms the job: this
worker registers again with the scheduler, which numbers the survivors anew (older
workers keep the low ranks) and adds workers that asked to join. The workers then
sync from rank 0 unless every one of them only saw hosts removed at a commit. A job
started without BYTEPS_ELASTIC=1 cannot re-form: `run` then ends with an InternalError
that names the failure, as any job does when it loses a worker.
"""

from __future__ import annotations

import copy
import enum
import functools
import queue
import re

import tensorflow as tf

from tf_bps.runtime import basics, ops
from tf_bps.training import preemption


class InternalError(RuntimeError):
    """A collective failed because the job lost a peer (or it timed out waiting for
    one): `run` restores the last commit and re-forms the job."""


# Horovod's name for it, which elastic scripts catch.
HorovodInternalError = InternalError


class HostsUpdatedInterrupt(RuntimeError):
    """The job's hosts changed: every worker raises it at the same commit, and `run`
    re-forms the job. `skip_sync`: only hosts were removed, so the survivors agree
    already and need no sync from rank 0."""

    def __init__(self, skip_sync: bool):
        super().__init__("the job's hosts changed" + (" (removals only)" if skip_sync else ""))
        self.skip_sync = skip_sync


class HostUpdateResult(enum.IntFlag):
    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class State:
    """What a worker commits, restores and syncs; subclasses say what that is."""

    def __init__(self):
        self._host_messages: queue.Queue = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks: list = []
        basics.add_host_listener(self._hear_of_hosts)

    def _hear_of_hosts(self, timestamp: float, added: bool) -> None:
        self.on_hosts_updated(timestamp, HostUpdateResult.added if added
                              else HostUpdateResult.removed)

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions (no arguments) called after every re-forming of the job, in order:
        to scale a learning rate to the new size, say."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update: HostUpdateResult) -> None:
        """Hears of a change of the job's hosts (from the launcher)."""
        self._host_messages.put((timestamp, update))

    def commit(self) -> None:
        """Saves the state, then raises HostsUpdatedInterrupt if the hosts changed."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises HostsUpdatedInterrupt on every worker alike when rank 0 heard of a
        change of hosts since the last check. A collective: every worker calls it."""
        previous = newest = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, result = self._host_messages.get()
            if timestamp > newest:
                newest = timestamp
                update |= result
        # Rank 0's view decides, so that every worker stops at the same step.
        previous, newest, update = ops.broadcast_object(
            (previous, newest, int(update)), 0, name="ElasticHostUpdates")
        self._last_updated_timestamp = newest
        if newest > previous:
            raise HostsUpdatedInterrupt(update == HostUpdateResult.removed)

    def reset(self) -> None:
        """Called when the job re-formed, before the reset callbacks."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain attributes (`ObjectState(epoch=0, batch=0)`), synced from rank 0 with
    pickle. Only the attributes named here are tracked."""

    def __init__(self, **kwargs):
        self._saved_state = dict(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        super().__init__()

    def save(self) -> None:
        self._saved_state = {name: copy.copy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.copy(value))

    def sync(self) -> None:
        # The committed values are what every worker goes on from.
        if self._saved_state:
            self._saved_state = ops.broadcast_object(self._saved_state, 0,
                                                     name="ElasticObjectState")
            self.restore()


class _VariablesState(ObjectState):
    """Variables kept as in-memory copies at each commit, plus tracked attributes."""

    def _variables(self) -> list:
        raise NotImplementedError

    def _save_variables(self) -> None:
        self._saved_values = [tf.identity(v) for v in self._variables()]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        variables = self._variables()
        if len(variables) != len(self._saved_values):
            raise ValueError(f"the state holds {len(self._saved_values)} variables, but the "
                             f"model now has {len(variables)}: it cannot be restored")
        for variable, value in zip(variables, self._saved_values, strict=True):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        ops.broadcast_variables(self._variables(), root_rank=0)
        self._save_variables()
        super().sync()


class TensorFlowState(_VariablesState):
    """`variables` (all of TensorFlow's global variables when None) and attributes."""

    def __init__(self, variables=None, session=None, **kwargs):
        if session is not None:
            raise ValueError("TensorFlowState(session=...) is TensorFlow 1's graph mode; "
                             "tf_bps's elastic state works eagerly")
        self.variables = list(variables if variables is not None
                              else tf.compat.v1.global_variables())
        self._saved_values = [tf.identity(v) for v in self.variables]
        super().__init__(**kwargs)

    def _variables(self) -> list:
        return self.variables


class TensorFlowKerasState(_VariablesState):
    """A Keras model's and its optimizer's variables, and attributes. (`backend`, a
    Keras 2 module in Horovod's signature, is not needed with Keras 3.)"""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if hasattr(model, "built") and not model.built:
            raise ValueError("the model must be built before its state is tracked "
                             "(call model.build(...) or run it once)")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._saved_values = [tf.identity(v) for v in self._variables()]
        super().__init__(**kwargs)

    def reset(self) -> None:
        # The job may have re-formed with another size: the steps Keras traced for the
        # old one (a strategy's replica count, the divisor of its averages) are traced
        # again at the next fit, evaluate or predict.
        for traced in ("train_function", "test_function", "predict_function"):
            if getattr(self.model, traced, None) is not None:
                setattr(self.model, traced, None)

    def _variables(self) -> list:
        variables = list(self.model.variables)
        if self.optimizer is not None:
            found = self.optimizer.variables
            variables += list(found() if callable(found) else found)
        return variables


# What our collectives raise when the job lost a peer, timed out waiting for one, or
# a round ended because another worker's operation failed. Inside a tf.function
# (Keras's train step) TensorFlow hands them on as InternalError, saying so.
_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                tf.errors.AbortedError)
_OUR_OPS = re.compile(r"Byteps(PushPull|Broadcast|Allgather|Alltoall|Reducescatter|"
                      r"AsyncPushPull)")
_REPLACED = re.compile(r"originally returned (Unavailable|DeadlineExceeded|Aborted)Error")


def _is_peer_loss(error: tf.errors.OpError) -> bool:
    """Whether `error` is one of our collectives failing for a lost peer."""
    message = error.message or ""
    ours = bool(_OUR_OPS.search(message)) or "tf_bps" in message
    if isinstance(error, tf.errors.InternalError):
        return ours and bool(_REPLACED.search(message))
    return ours and isinstance(error, _PEER_ERRORS)


def _reform(cause: Exception) -> None:
    if not basics.config().elastic:
        raise InternalError(f"{cause}; tf_bps cannot re-form this job (it was started "
                            "without BYTEPS_ELASTIC=1), so it ends here") from cause
    basics.reform()


def _sync_needed(here: bool) -> bool:
    """Whether any worker needs the state synced from rank 0 as the job (re-)forms: one
    that starts or joins, restored a commit, or saw workers added. A collective: a
    worker's own reason need not be the others' (one cut off in a commit's last
    collective restores, while those that finished it saw only hosts removed)."""
    wanted = ops.push_pull(tf.constant([int(here)], tf.int32), op=ops.Max,
                           name="ElasticSyncNeeded")
    return bool(int(wanted[0]))


def run_with_reset(func, reset):
    """`run`, with the re-forming of the job given: `reset(cause)` re-forms it after
    `cause` (an InternalError or a HostsUpdatedInterrupt), or raises."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        preemption.listen()
        skip_sync = False
        while True:
            try:
                try:
                    # The sync too: a peer may be lost before the first step.
                    if _sync_needed(not skip_sync):
                        state.sync()
                    return func(state, *args, **kwargs)
                except tf.errors.OpError as error:
                    if not _is_peer_loss(error):
                        raise
                    raise InternalError(str(error.message)) from error
            except InternalError as error:
                state.restore()
                skip_sync, cause = False, error
            except HostsUpdatedInterrupt as interrupt:
                skip_sync, cause = interrupt.skip_sync, interrupt
            if preemption.leaves_at_commit():
                preemption.leave(state)
            reset(cause)
            state.on_reset()

    return wrapper


def run(func):
    """Decorates `func(state, ...)`: syncs the state from rank 0 and calls it. When a
    collective inside fails for a lost peer (InternalError), it restores the last
    commit; after that, or when the hosts changed (HostsUpdatedInterrupt), the job
    re-forms, the state is synced from the new rank 0 (unless hosts were only removed)
    and `func` runs again. Without BYTEPS_ELASTIC=1 `run` ends with an InternalError
    that names the failure."""
    return run_with_reset(func, _reform)
