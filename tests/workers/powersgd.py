"""PowerSGD through DistributedGradientTape, step by step against a numpy model of its
definition that knows every rank's gradients; prints a REPORT."""

import json

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
print("REPORT " + json.dumps(report), flush=True)
