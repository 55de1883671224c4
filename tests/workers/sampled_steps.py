"""Gradient down-sampling and the step-time check (run with PERSEUS_DOWNSAMPLE_N_ELEMENTS,
PERSEUS_GRADIENT_MOMENTUM and PERSEUS_PERF_CHECK_N_STEPS set, see test_perseus.py).
Rank r applies the gradient (r + 1) x [1, 2, 3, 4, 5] for `steps` steps with SGD(1.0)
inside a tf.function, synchronised by DistributedOptimizer (`optimizer`) or by
DistributedGradientTape (`tape`, the gradient of (r + 1) x [1..5] . kernel); rank 1
sleeps 0.3 s before each step, so it is the slow one.
Prints REPORT {json} per rank with the kernel after the steps."""

import json
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

mode, steps = sys.argv[1], int(sys.argv[2])
bps.init()
rank = bps.rank()
model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(5, use_bias=False)])
model.layers[0].kernel.assign(np.zeros((1, 5), "float32"))
gradient = tf.constant([[1.0, 2.0, 3.0, 4.0, 5.0]]) * (rank + 1)
if mode == "optimizer":
    optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(1.0))
else:
    optimizer = keras.optimizers.SGD(1.0)


@tf.function
def step():
    kernel = model.layers[0].kernel
    if mode == "optimizer":
        optimizer.apply([gradient], [kernel])
        return
    with bps.DistributedGradientTape(tf.GradientTape(), name="DistributedOptimizer") as tape:
        loss = tf.reduce_sum(gradient * kernel)
    optimizer.apply(tape.gradient(loss, [kernel]), [kernel])


for _ in range(steps):
    if rank == 1:
        time.sleep(0.3)
    step()
print("REPORT " + json.dumps({"rank": rank,
                              "kernel": model.layers[0].kernel.numpy().ravel().tolist()}),
      flush=True)
