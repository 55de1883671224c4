"""AIACC-Training's gradient down-sampling: PERSEUS_DOWNSAMPLE_N_ELEMENTS=N with
PERSEUS_GRADIENT_MOMENTUM=m.

Each step synchronises one element in N of every dense gradient, a different share in
turn (the elements whose flat index is the step number mod N), so gradients put 1/N of
their bytes on the wire. What a worker has not sent yet stays in a local residual,
which decays by m each step and is sent with the element's next turn: m = 1 keeps every
gradient until it is sent; with a momentum optimizer, whose momentum already carries
past gradients, AIACC suggests 0.9. An element whose turn it is not gets a zero
gradient that step.
"""

from __future__ import annotations

import tensorflow as tf


class DownSampler:
    """The residuals and the step count of one optimizer (or tape)."""

    def __init__(self, every: int, momentum: float):
        self.every = every
        self.momentum = momentum
        self._residuals: dict[str, tf.Variable] = {}
        self._step: tf.Variable | None = None

    def _variable(self, key: str, like: tf.Tensor) -> tf.Variable:
        if key not in self._residuals:
            with tf.init_scope():
                self._residuals[key] = tf.Variable(tf.zeros(like.shape, like.dtype),
                                                   trainable=False, name="bps_residual")
        return self._residuals[key]

    def sample(self, grads: list[tf.Tensor], names: list[str]):
        """This step's share of each gradient (with what it carried over), and a function
        that turns their synchronised values back into full gradients."""
        if self._step is None:
            with tf.init_scope():
                self._step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="bps_downsample_step")
        offset = self._step % self.every
        self._step.assign_add(1)
        shares, shapes, masks = [], [], []
        for grad, name in zip(grads, names, strict=True):
            residual = self._variable(name, grad)
            carried = residual * tf.cast(self.momentum, grad.dtype) + grad
            table = self._table(carried)
            mask = tf.one_hot(offset, self.every, dtype=grad.dtype)
            residual.assign(self._untable(table * (1 - mask), grad.shape))
            shares.append(tf.gather(table, offset, axis=1))
            shapes.append(grad.shape)
            masks.append(mask)

        def restore(synchronised: list[tf.Tensor]) -> list[tf.Tensor]:
            return [self._untable(tf.expand_dims(share, 1) * mask, shape)
                    for share, mask, shape in zip(synchronised, masks, shapes, strict=True)]

        return shares, restore

    def _table(self, tensor: tf.Tensor) -> tf.Tensor:
        """The flat tensor, zero-padded to whole rows of `every` columns: column k holds
        the elements whose index is k mod `every`."""
        flat = tf.reshape(tensor, [-1])
        rows = -(-tensor.shape.num_elements() // self.every)
        padded = tf.pad(flat, [[0, rows * self.every - tensor.shape.num_elements()]])
        return tf.reshape(padded, [rows, self.every])

    @staticmethod
    def _untable(table: tf.Tensor, shape: tf.TensorShape) -> tf.Tensor:
        return tf.reshape(tf.reshape(table, [-1])[:shape.num_elements()], shape)
