"""PowerSGD through DistributedGradientTape, step by step against a numpy model of its
definition that knows every rank's gradients; prints a REPORT."""

import json

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

bps.init()
rank, size = bps.rank(), bps.size()
report = {"rank": rank}
SHAPES = {"kernel": (12, 3, 4), "bias": (4,), "small": (2, 2)}
variables = {name: tf.Variable(tf.zeros(shape), name=name) for name, shape in SHAPES.items()}


def gradients(step: int, worker: int) -> dict:
    rng = np.random.default_rng(1000 * step + worker)
    return {name: rng.normal(size=shape).astype("float32") for name, shape in SHAPES.items()}


powersgd = bps.Compression.powersgd(rank=2, start_iter=1, min_compression_rate=1.5)


@tf.function
def synchronised(mine):
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(variables[n] * mine[n]) for n in SHAPES])
    tape = bps.DistributedGradientTape(tape, compression=powersgd)
    return dict(zip(SHAPES, tape.gradient(loss, [variables[n] for n in SHAPES]), strict=True))


# The model: every worker's matrix, its error, and the shared Q.
errors = [np.zeros((36, 4), "float64") for _ in range(size)]
q = None
worst = {"kernel": 0.0, "others": 0.0, "whole_step": 0.0}
for step in range(1, 5):
    every = [gradients(step, w) for w in range(size)]
    mine = {n: tf.constant(g) for n, g in every[rank].items()}
    got = {n: g.numpy() for n, g in synchronised(mine).items()}
    mean = {n: np.mean([g[n] for g in every], axis=0) for n in SHAPES}
    worst["others"] = max(worst["others"], *(float(np.max(np.abs(got[n] - mean[n])))
                                             for n in ("bias", "small")))
    if step == 1:  # start_iter: the first step travels whole
        worst["whole_step"] = float(np.max(np.abs(got["kernel"] - mean["kernel"])))
        [state] = powersgd._state.values()  # the kernel's: the one matrix worth it
        q = state.q.numpy().astype("float64")  # still its random start
        continue
    matrices = [g["kernel"].reshape(36, 4) + e for g, e in zip(every, errors, strict=True)]
    p = np.mean([m @ q for m in matrices], axis=0)
    p, _ = np.linalg.qr(p)
    q = np.mean([m.T @ p for m in matrices], axis=0)
    approximation = p @ q.T
    errors = [m - approximation for m in matrices]
    worst["kernel"] = max(worst["kernel"], float(np.max(np.abs(
        got["kernel"].reshape(36, 4) - approximation))))
    report.setdefault("differs_from_mean", []).append(
        float(np.max(np.abs(got["kernel"] - mean["kernel"]))))
report["worst"] = worst
report["compresses"] = sorted(powersgd._state)
try:
    bps.DistributedGradientTape(tf.GradientTape(), compression=powersgd,
                                gradient_predivide_factor=2.0)
except ValueError as error:
    report["predivide"] = str(error)

# Under ParameterServerStrategy, in model.fit: a linear layer trained by SGD on a global
# batch that each worker reads half of. PowerSGD's arithmetic depends only on the sums
# over the workers (of gradients and of errors), so the model needs no worker's share.
keras.utils.set_random_seed(3)
rng = np.random.default_rng(7)
x = rng.normal(size=(16, 36)).astype("float32")
y = rng.normal(size=(16, 4)).astype("float32")
strategy_powersgd = bps.Compression.powersgd(rank=2, start_iter=1, min_compression_rate=1.5)
strategy = bps.ParameterServerStrategy(compression=strategy_powersgd)
with strategy.scope():
    model = keras.Sequential([keras.Input((36,)), keras.layers.Dense(4, use_bias=False)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
w = model.weights[0].numpy().astype("float64")
error = np.zeros_like(w)
worst_fit = 0.0
for step in range(1, 5):
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    gradient = 2 * x.T @ (x @ w - y) / y.size
    if step == 1:
        w = w - 0.1 * gradient
        [state] = strategy_powersgd._state.values()
        q = state.q.numpy().astype("float64")
    else:
        matrix = gradient + error
        p, _ = np.linalg.qr(matrix @ q)
        q = matrix.T @ p
        approximation = p @ q.T
        error = matrix - approximation
        w = w - 0.1 * approximation
    worst_fit = max(worst_fit, float(np.max(np.abs(model.weights[0].numpy() - w))))
report["strategy"] = {"worst": worst_fit, "keys": sorted(strategy_powersgd._state),
                      "weights": model.weights[0].numpy().ravel().tolist()}

# The strategy with Compression.fp16: gradients travel as float16 (one step; a float16
# sum of float16 shares differs from the float32 gradient by its rounding, no more).
with bps.ParameterServerStrategy(compression=bps.Compression.fp16).scope():
    model = keras.Sequential([keras.Input((36,)), keras.layers.Dense(4, use_bias=False)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
w = model.weights[0].numpy()
model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
expected = w - 0.1 * (2 * x.T @ (x @ w - y) / y.size)
report["fp16"] = {"worst": float(np.max(np.abs(model.weights[0].numpy() - expected))),
                  "weights": model.weights[0].numpy().ravel().tolist()}
print("REPORT " + json.dumps(report), flush=True)
