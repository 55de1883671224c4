"""SyncBatchNormalization: batch normalisation whose batch statistics are those of the
whole job's batch, every worker's rows together (Horovod's SyncBatchNormalization).

Each worker sends three sums per channel (of its values, their squares, and how many
there are); their totals over the workers give the mean and the variance of the global
batch. The sums travel in one push_pull, whose gradient is the push_pull of the
gradients: so backpropagation reaches every worker's rows through the shared statistics,
and the gradients averaged over the workers are those of one process on the global batch.
Counting rows (rather than averaging each worker's mean, as Horovod does) keeps the
statistics exact when workers hold batches of different sizes, or masks.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tf_bps.runtime import basics, ops


@keras.saving.register_keras_serializable(package="tf_bps")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization with statistics over every worker's batch.

    Takes BatchNormalization's arguments. `fused` (Horovod's tf.keras argument) may be
    False or None; a fused kernel cannot be synchronised. Inside a tf.distribute strategy
    (tf_bps.ParameterServerStrategy) the sums go through the strategy's all-reduce, which
    spans the replicas of every worker; otherwise through push_pull over the workers.
    Alone (one worker) it is BatchNormalization.
    """

    def __init__(self, *args, fused=None, **kwargs):
        if fused not in (False, None):
            raise ValueError(f"fused={fused!r}: SyncBatchNormalization computes its "
                             "statistics across workers and has no fused kernel; pass "
                             "fused=False or leave it out")
        kwargs.pop("synchronized", None)  # It is, whatever a saved config says.
        super().__init__(*args, **kwargs)

    def _moments(self, inputs, mask):
        if not tf.distribute.has_strategy() and not basics.is_distributed():
            return super()._moments(inputs, mask)
        axes = list(self._reduction_axes)
        if mask is None:
            weights = tf.ones_like(inputs)
        else:
            weights = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), inputs.dtype),
                                      tf.shape(inputs))
        weighted = inputs * weights
        local = tf.stack([tf.reduce_sum(weighted, axes),
                          tf.reduce_sum(weighted * inputs, axes),
                          tf.reduce_sum(weights, axes)])
        total, total_squares, count = tf.unstack(_sum_over_workers(local))
        mean = tf.math.divide_no_nan(total, count)
        variance = tf.maximum(tf.math.divide_no_nan(total_squares, count)
                              - tf.square(mean), 0.0)
        return mean, variance


def _sum_over_workers(local: tf.Tensor) -> tf.Tensor:
    if tf.distribute.has_strategy():
        context = tf.distribute.get_replica_context()
        if context is None:
            raise ValueError("SyncBatchNormalization was called in a cross-replica context; "
                             "call the model inside strategy.run or model.fit")
        return context.all_reduce(tf.distribute.ReduceOp.SUM, local)
    return ops.push_pull(local, op=ops.Sum)
