"""What the strategy needs from Keras's optimizer and cannot see from its cross-device
ops:
  - the learning rate of each step. A core compressor's error feedback rescales what
    it carries when the rate changes (bps.set_compression_learning_rate), and under the
    strategy the gradients reach the core through the optimizer's all-reduce, which Keras
    calls with the step's rate in hand (TensorFlow backend, _backend_update_step);
  - where gradients accumulate (gradient_accumulation_steps). Keras adds each pass's
    gradients to its accumulators or, every N passes, reduces and applies them, in the
    two branches of one conditional (BaseOptimizer._backend_apply_gradients), where
    TensorFlow refuses the merge_call a reduction or an update makes in a replica."""

from __future__ import annotations

import functools

import tensorflow as tf

from tf_bps.runtime.ops import set_compression_learning_rate

_installed = False
_accumulation_installed = False


def install() -> None:
    """Makes Keras's TensorFlow optimizers tell the core each step's learning rate before
    their all-reduce, under a strategy that asks for it (`_bps_tells_learning_rate`)."""
    global _installed
    if _installed:
        return
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    update_step = TFOptimizer._backend_update_step

    @functools.wraps(update_step)
    def telling_the_rate(self, grads, trainable_variables, learning_rate):
        if not getattr(tf.distribute.get_strategy(), "_bps_tells_learning_rate", False):
            return update_step(self, grads, trainable_variables, learning_rate)
        told = set_compression_learning_rate(learning_rate)
        # In a graph the all-reduce's push_pulls must come after it (None: eager, done).
        with tf.control_dependencies([] if told is None else [told]):
            return update_step(self, grads, trainable_variables, learning_rate)

    TFOptimizer._backend_update_step = telling_the_rate
    _installed = True


def install_accumulation() -> None:
    """Makes Keras's TensorFlow optimizers with gradient_accumulation_steps apply their
    gradients, under a strategy that can reduce and update without merge_call
    (`_bps_updates_in_the_replica`), inside it: the conditional then push_pulls the
    accumulated gradients on the update step only, and the other passes stay local."""
    global _accumulation_installed
    if _accumulation_installed:
        return
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    apply_gradients = TFOptimizer._backend_apply_gradients

    @functools.wraps(apply_gradients)
    def accumulating_in_the_replica(self, grads, trainable_variables):
        in_the_replica = getattr(tf.distribute.get_strategy().extended,
                                 "_bps_updates_in_the_replica", None)
        if (not self.gradient_accumulation_steps or in_the_replica is None
                or tf.distribute.in_cross_replica_context()):
            return apply_gradients(self, grads, trainable_variables)
        with in_the_replica():
            return apply_gradients(self, grads, trainable_variables)

    TFOptimizer._backend_apply_gradients = accumulating_in_the_replica
    _accumulation_installed = True
