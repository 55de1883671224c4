"""AIACC-Training's step-time check: PERSEUS_PERF_CHECK_N_STEPS=N.

In synchronous training every worker's step takes as long as the slowest one's, so the
check compares what each worker spends outside synchronisation: from the end of its
previous update to the moment its gradients are ready (input, forward and backward
pass). Every N steps the workers gather their means over those steps, and rank 0
reports each worker whose mean is more than OUTLIER_RATIO times the median of the
others', by rank and host. The timestamps are graph ops (tf.timestamp), so the check
also works inside tf.function; it adds one tiny allgather every N steps.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

from tf_bps.runtime import basics, raw_ops

OUTLIER_RATIO = 1.5
MIN_GAP_S = 0.002  # below this, differences are noise, whatever the ratio


def outliers(seconds: list[float]) -> list[tuple[int, float, float]]:
    """(rank, its time, the others' median) for each worker that is an outlier."""
    found = []
    for rank, mine in enumerate(seconds):
        others = float(np.median([s for r, s in enumerate(seconds) if r != rank]))
        if mine > OUTLIER_RATIO * others and mine - others > MIN_GAP_S:
            found.append((rank, mine, others))
    return found


class StepTimeCheck:
    """Wraps each step of one optimizer (or tape): begin() when its gradients are
    ready, end() once its update (or synchronisation) is done."""

    def __init__(self, every: int, name: str):
        self.every = every
        self.name = name
        self._state: tuple[tf.Variable, ...] | None = None

    def begin(self, grads) -> None:
        if self._state is None:
            with tf.init_scope():
                self._state = tuple(
                    tf.Variable(0, dtype=dtype, trainable=False, name=f"bps_perf_{name}")
                    for name, dtype in (("last_end", tf.float64), ("compute", tf.float64),
                                        ("gaps", tf.float64), ("steps", tf.int64)))
        last_end, compute, gaps, _ = self._state
        dense = [tf.convert_to_tensor(g) for g in grads
                 if g is not None and not isinstance(g, tf.IndexedSlices)]
        with tf.control_dependencies(dense):
            now = tf.timestamp()
        # The first step has no previous end to measure from.
        measured = last_end > 0
        zero = tf.constant(0.0, tf.float64)
        compute.assign_add(tf.where(measured, now - last_end, zero))
        gaps.assign_add(tf.where(measured, tf.constant(1.0, tf.float64), zero))

    def end(self, done) -> None:
        last_end, compute, gaps, steps = self._state
        with tf.control_dependencies([tf.convert_to_tensor(d) for d in done]):
            last_end.assign(tf.timestamp())
        count = steps.assign_add(1)

        def report():
            mine = tf.reshape(compute / tf.maximum(gaps, 1.0), [1])
            gathered = raw_ops.allgather(mine, name=f"{self.name}.perf_check")
            if basics.rank() == 0:
                tf.py_function(lambda seconds, step: _print_report(seconds.numpy().tolist(),
                                                                   int(step)),
                               [gathered, count], [])
            compute.assign(0.0)
            gaps.assign(0.0)
            return tf.constant(True)

        tf.cond(count % self.every == 0, report, lambda: tf.constant(False))


def _print_report(seconds: list[float], step: int) -> None:
    hosts = basics.worker_hosts()
    for rank, mine, others in outliers(seconds):
        print(f"tf_bps: step-time check (PERSEUS_PERF_CHECK_N_STEPS) at step {step}: "
              f"worker rank {rank} on {hosts[rank]} spends {mine * 1e3:.1f} ms per step "
              f"outside synchronisation, {mine / others:.1f}x the other workers' median "
              f"({others * 1e3:.1f} ms)", file=sys.stderr, flush=True)
