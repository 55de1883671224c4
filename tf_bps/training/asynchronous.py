"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1 on workers and servers), the BytePS way.

The servers keep the parameters. Each worker applies its optimizer step to its own
copy, pushes the change that step made (the weight delta) and carries on from the
parameters the servers send back, which by then hold every delta any worker pushed
before. No worker waits for another; only a variable's first exchange is special: it
hands the servers rank 0's initial value, and every worker continues from that.

The wire operation is the core's kAsyncPushPull (custom_ops/wire/protocol.h).
DistributedOptimizer (training/distributed.py) and ParameterServerStrategy call this module; both
pass each variable as the list of plain variables that hold its value (one, or a
mirrored variable's per-device copies).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_bps.runtime import basics, raw_ops


class AsyncExchange:
    """The parameter exchange of one optimizer (or strategy): the delta exchange around
    each local step, and per variable whether the servers hold it yet."""

    def __init__(self):
        self._started: dict[str, tf.Variable] = {}
        basics.add_generation_listener(self._forget_servers)

    def _forget_servers(self) -> None:
        """The job re-formed: its servers hold no parameters, so each variable's next
        exchange hands them rank 0's value again, not a delta."""
        for started in self._started.values():
            started.assign(False)

    @staticmethod
    def snapshot(copies: Sequence[Sequence[tf.Variable]]) -> list[tf.Tensor]:
        """The values before the local step (read before it writes, in program order)."""
        return [tf.identity(tf.convert_to_tensor(c[0])) for c in copies]

    def exchange(self, copies: Sequence[Sequence[tf.Variable]], before: Sequence[tf.Tensor],
                 names: Sequence[str]) -> None:
        """Pushes what the local step changed and takes the servers' parameters. A
        variable's first exchange pushes its value from before the step first: the
        servers keep rank 0's, and every worker's change is added to that. Decided in
        the graph, so that models Keras builds inside the first step work too."""
        for variable_copies, old, name in zip(copies, before, names, strict=True):
            started = self._flag(name)
            delta = tf.convert_to_tensor(variable_copies[0]) - old

            def first(old=old, delta=delta, name=name):
                raw_ops.async_push_pull(old, name)  # round 1: the initial value
                return raw_ops.async_push_pull(delta, name)

            latest = tf.cond(started, lambda delta=delta, name=name:
                             raw_ops.async_push_pull(delta, name), first)
            for copy in variable_copies:
                copy.assign(latest)
            started.assign(True)

    def _flag(self, name: str) -> tf.Variable:
        if name not in self._started:
            with tf.init_scope():
                self._started[name] = tf.Variable(False, trainable=False,
                                                  name="bps_async_started")
        return self._started[name]
