"""AIACC-Training's variables at work (run with them set, see test_perseus.py): wire
type and scale, fusion, local accumulation, allgather's layout and the NaN check.
Prints REPORT {json} per rank."""

import json
import math

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

bps.init()
rank = bps.rank()
report = {"rank": rank}

# Gradients of 0.25 multiples: exact in float16, also after the scale.
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
model.layers[0].kernel.assign(np.zeros((2, 3), "float32"))
model.layers[0].bias.assign(np.zeros(3, "float32"))
optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(1.0))
report["passes"] = optimizer._bps_passes
grads = [tf.fill([2, 3], 0.25 * (rank + 1)), tf.fill([3], -0.5 * (rank + 1))]
for _ in range(report["passes"]):
    optimizer.apply(grads, model.trainable_variables)
report["kernel"] = model.layers[0].kernel.numpy().tolist()
report["bias"] = model.layers[0].bias.numpy().tolist()

gathered = bps.allgather(tf.fill([1, 2], float(rank)), name="layout")
report["allgather_shape"] = gathered.shape.as_list()

try:
    bps.push_pull(tf.constant([math.nan if rank == 1 else 1.0]), name="nan_probe")
    report["nan"] = "no error"
except tf.errors.OpError as error:
    report["nan"] = error.message
# Both workers have their answer before either leaves (a leader that is gone cannot say
# why the round ended).
bps.push_pull(tf.ones([1]), name="done")
print("REPORT " + json.dumps(report), flush=True)
