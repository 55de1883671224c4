"""Keras's LossScaleOptimizer across workers. It skips a step whose gradients hold an
Inf or a NaN (and halves its loss scale), and every worker must skip the same steps:
one that applied a step would otherwise wait forever for the push_pulls of one that
skipped it. Where the gradients it checks are this worker's own, the workers vote, and
a step is finite only if it is finite on every one of them: when it wraps a
DistributedOptimizer (as model.compile does under a mixed_float16 policy), and under
ParameterServerStrategy, which reduces the gradients after it looked. Wrapped by a
DistributedOptimizer, it checks gradients every worker shares, and nothing is added."""

from __future__ import annotations

import functools

import tensorflow as tf
from tensorflow.python.distribute import values_util

from tf_bps.runtime import basics, raw_ops
from tf_bps.runtime.raw_ops import Min

_installed = False


def _voters(optimizer) -> int | None:
    """The process set whose workers vote on `optimizer`'s steps; None: no vote."""
    if not basics.is_initialized() or basics.size() == 1:
        return None
    options = getattr(optimizer.inner_optimizer, "_bps_options", None)
    if options is not None:  # a DistributedOptimizer inside
        return options.process_set_id if options.synchronises_here() else None
    strategy = tf.distribute.get_strategy()
    if getattr(strategy, "synchronises_gradients_with_tf_bps", False) and \
            not getattr(strategy.extended, "_bps_async", False):
        return 0
    return None


def install() -> None:
    """Makes LossScaleOptimizer.check_finite a vote of the workers where it checks
    local gradients (see the module's comment)."""
    global _installed
    if _installed:
        return
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    check_finite = LossScaleOptimizer.check_finite

    @functools.wraps(check_finite)
    def finite_everywhere(self, grads):
        finite = check_finite(self, grads)
        set_id = _voters(self)
        if set_id is None:
            return finite
        # Each local replica votes under its own name (several may vote at once).
        replica = values_util.get_current_replica_id_as_int() or 0
        votes = raw_ops.push_pull(tf.cast(finite, tf.int32), f"LossScale.finite.{replica}",
                                  Min, set_id=set_id)
        return tf.cast(votes, tf.bool)

    LossScaleOptimizer.check_finite = finite_everywhere
    _installed = True
