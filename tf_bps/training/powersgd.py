"""PowerSGD (Vogels et al., 2019; PyTorch's powerSGD_hook): low-rank gradient compression
with error feedback, built from push_pull.

A gradient of rank >= 2 is seen as a matrix M: its last dimension (a Keras layer's
outputs: the columns of a Dense kernel, the filters of a convolution's) by the rest. Each
step, with Q (m x r) known to every worker:
    M += error                       (what earlier steps did not send)
    P = M Q;      P = mean of P over the workers;   P = orthonormal basis of P
    Q = M^T P;    Q = mean of Q over the workers
    result = P Q^T;  error = M - result
so two small matrices travel instead of M: r (n + m) numbers instead of n m. The
servers sum the factors as they sum any tensor. Q is kept for the next step (warm
start), which makes one step of power iteration per training step. Before `start_iter`
steps, and for vectors and matrices too small to gain `min_compression_rate`, gradients
travel whole.

Orthonormalisation is a QR decomposition of the same P on every worker, so they agree
bit for bit; the result does not depend on the signs QR chooses (P Q^T is the same).
"""

from __future__ import annotations

import math
import zlib

import tensorflow as tf

from tf_bps.runtime import raw_ops
from tf_bps.runtime.raw_ops import ReduceOp, Sum


class PowerSGD:
    """bps.Compression.powersgd(...): the settings, and the state (per gradient name:
    Q, the error, the step count) that carries from step to step."""

    def __init__(self, rank: int = 1, start_iter: int = 1000, min_compression_rate: float = 2.0,
                 use_error_feedback: bool = True, warm_start: bool = True, seed: int = 0):
        for name, value in (("rank", rank), ("start_iter", start_iter), ("seed", seed)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"powersgd: {name}={value!r} must be an integer")
        if rank < 1:
            raise ValueError(f"powersgd: rank={rank} must be >= 1")
        if start_iter < 0:
            raise ValueError(f"powersgd: start_iter={start_iter} must be >= 0")
        if not isinstance(min_compression_rate, (int, float)) or isinstance(
                min_compression_rate, bool) or not min_compression_rate >= 1:
            raise ValueError(f"powersgd: min_compression_rate={min_compression_rate!r} must "
                             "be a number >= 1")
        for name, value in (("use_error_feedback", use_error_feedback),
                            ("warm_start", warm_start)):
            if not isinstance(value, bool):
                raise ValueError(f"powersgd: {name}={value!r} must be True or False")
        self.rank = rank
        self.start_iter = start_iter
        self.min_compression_rate = float(min_compression_rate)
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.seed = seed
        self._state: dict[str, _MatrixState] = {}

    def __repr__(self):
        return (f"Compression.powersgd(rank={self.rank}, start_iter={self.start_iter}, "
                f"min_compression_rate={self.min_compression_rate}, "
                f"use_error_feedback={self.use_error_feedback}, "
                f"warm_start={self.warm_start}, seed={self.seed})")

    def compresses(self, grad) -> bool:
        """Whether `grad` travels as factors: a float matrix (rank >= 2, known shape)
        whose factors are at least `min_compression_rate` times smaller."""
        shape = grad.shape
        if grad.dtype not in (tf.float32, tf.float64) or shape.rank is None or shape.rank < 2:
            return False
        if not shape.is_fully_defined():
            return False
        rows, columns = math.prod(shape[:-1]), shape[-1]
        rank = min(self.rank, rows, columns)
        return (rows + columns) * rank * self.min_compression_rate < rows * columns

    def synchronise(self, grad: tf.Tensor, name: str, op: ReduceOp, set_id: int,
                    group_size: int) -> tf.Tensor:
        """`grad` reduced (op Average or Sum) over the group: whole before start_iter,
        as low-rank factors after."""
        state = self._state_of(grad, name)
        step = state.step.assign_add(1)

        def whole():
            return _reduced(grad, name, op, set_id, group_size)

        def factored():
            return state.compress(grad, name, op, set_id, group_size, step)

        if self.start_iter == 0:
            return factored()
        return tf.cond(step > self.start_iter, factored, whole)

    def _state_of(self, grad, name: str) -> _MatrixState:
        state = self._state.get(name)
        if state is None:
            with tf.init_scope():
                state = _MatrixState(self, grad.shape, grad.dtype, name)
            self._state[name] = state
        return state


def _reduced(tensor, name: str, op: ReduceOp, set_id: int, group_size: int) -> tf.Tensor:
    summed = raw_ops.push_pull(tensor, name, Sum, set_id=set_id)
    return summed / tf.cast(group_size, summed.dtype) if op != Sum else summed


class _MatrixState:
    """One gradient's Q, error and step count, as variables so that they live in
    tf.function graphs."""

    def __init__(self, settings: PowerSGD, shape: tf.TensorShape, dtype, name: str):
        self.settings = settings
        self.rows, self.columns = math.prod(shape[:-1]), shape[-1]
        self.rank = min(settings.rank, self.rows, self.columns)
        self.shape = shape
        # The same start on every worker: seeded by the settings and the gradient's name.
        self.stream = zlib.crc32(name.encode())
        self.q = tf.Variable(self._random_q(0, dtype), trainable=False, name="powersgd_q")
        self.error = (tf.Variable(tf.zeros([self.rows, self.columns], dtype), trainable=False,
                                  name="powersgd_error")
                      if settings.use_error_feedback else None)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="powersgd_step")

    def _random_q(self, step, dtype):
        seed = tf.stack([tf.cast(self.settings.seed, tf.int64) * 1_000_003 + self.stream,
                         tf.cast(step, tf.int64)])
        return tf.random.stateless_normal([self.columns, self.rank], seed=seed, dtype=dtype)

    def compress(self, grad, name, op, set_id, group_size, step):
        matrix = tf.reshape(grad, [self.rows, self.columns])
        if self.error is not None:
            matrix = matrix + self.error
        q = self.q if self.settings.warm_start else self._random_q(step, matrix.dtype)
        p = _reduced(tf.matmul(matrix, q), f"{name}.powersgd.p", op, set_id, group_size)
        p, _ = tf.linalg.qr(p)
        q = _reduced(tf.matmul(matrix, p, transpose_a=True), f"{name}.powersgd.q", op, set_id,
                     group_size)
        approximation = tf.matmul(p, q, transpose_b=True)
        updates = []
        if self.settings.warm_start:
            updates.append(self.q.assign(q))
        if self.error is not None:
            # A sum stands for every worker's matrix; the error is this worker's share.
            mine = approximation / group_size if op == Sum else approximation
            updates.append(self.error.assign(matrix - mine))
        with tf.control_dependencies(updates):
            return tf.reshape(tf.identity(approximation), self.shape)
