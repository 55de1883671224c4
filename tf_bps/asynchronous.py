"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1 on workers and servers), the BytePS way.

The servers keep the parameters. Each worker applies its optimizer step to its own
copy, pushes the change that step made (the weight delta) and carries on from the
parameters the servers send back, which by then hold every delta any worker pushed
before. No worker waits for another; only a variable's first exchange is special: it
hands the servers rank 0's initial value, and every worker starts from that.

The wire operation is the core's kAsyncPushPull (custom_ops/core/protocol.h).
DistributedOptimizer (training.py) and ParameterServerStrategy call this module; both
pass each variable as the list of plain variables that hold its value (one, or a
mirrored variable's per-device copies).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_bps import ops


class AsyncExchange:
    """The parameter exchange of one optimizer (or strategy): which variables the
    servers already hold, and the delta exchange around each local step."""

    def __init__(self):
        self._started: set[str] = set()

    def start(self, copies: Sequence[Sequence[tf.Variable]], names: Sequence[str]) -> None:
        """Makes sure the servers hold each variable: the first time a name is seen, its
        value goes to the servers and every worker's copies take rank 0's. Runs eagerly
        (out of any function being traced), once per variable."""
        fresh = [(c, n) for c, n in zip(copies, names, strict=True) if n not in self._started]
        if not fresh:
            return
        with tf.init_scope():
            for variable_copies, name in fresh:
                initial = ops._async_push_pull(tf.convert_to_tensor(variable_copies[0]), name)
                for copy in variable_copies:
                    copy.assign(initial)
                self._started.add(name)

    @staticmethod
    def snapshot(copies: Sequence[Sequence[tf.Variable]]) -> list[tf.Tensor]:
        """The values before the local step (read before it writes, in program order)."""
        return [tf.identity(tf.convert_to_tensor(c[0])) for c in copies]

    @staticmethod
    def exchange(copies: Sequence[Sequence[tf.Variable]], before: Sequence[tf.Tensor],
                 names: Sequence[str]) -> None:
        """Pushes what the local step changed and takes the servers' parameters."""
        for variable_copies, old, name in zip(copies, before, names, strict=True):
            delta = tf.convert_to_tensor(variable_copies[0]) - old
            latest = ops._async_push_pull(delta, name)
            for copy in variable_copies:
                copy.assign(latest)
