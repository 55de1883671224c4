"""Asynchronous training (run with BYTEPS_ENABLE_ASYNC=1 on every role, see
test_async.py). Each worker fits the same linear model on its own data for the same
wall time, through DistributedOptimizer (`optimizer`) or ParameterServerStrategy
(`strategy`); rank 1 is slow: it sleeps after every step. Prints REPORT {json} per rank:
its step count, its loss on the whole problem, its weights before training, and a probe
variable that started at rank + 1 after one step of learning rate 0."""

import json
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

mode, seconds = sys.argv[1], float(sys.argv[2])
bps.init()
rank = bps.rank()
keras.utils.set_random_seed(rank)  # Each worker starts from different weights.

true_kernel = np.arange(1, 9, dtype="float32").reshape(8, 1) / 4
features = np.random.default_rng(rank).normal(size=(4096, 8)).astype("float32")
targets = features @ true_kernel + 0.5
dataset = tf.data.Dataset.from_tensor_slices((features, targets)).repeat().batch(32)

# A step that changes nothing leaves every worker with the servers' initial value.
probe = keras.Variable(np.full(3, rank + 1.0, "float32"))
bps.DistributedOptimizer(keras.optimizers.SGD(0.0), name="probe").apply(
    [tf.ones(3)], [probe])


class Pace(keras.callbacks.Callback):
    """Counts steps, slows rank 1 down and stops every worker after `seconds`."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_begin(self, logs=None):
        self.initial_kernel = self.model.layers[0].kernel.numpy().ravel().tolist()
        self.start = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if rank == 1:
            time.sleep(0.2)
        if time.monotonic() - self.start > seconds:
            self.model.stop_training = True


def build(optimizer):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


if mode == "optimizer":
    model = build(bps.DistributedOptimizer(keras.optimizers.SGD(0.05)))
else:
    strategy = bps.ParameterServerStrategy()
    with strategy.scope():
        model = build(keras.optimizers.SGD(0.05))
pace = Pace()
model.fit(dataset, epochs=1, steps_per_epoch=1_000_000, callbacks=[pace], verbose=0)
all_features = np.random.default_rng(99).normal(size=(2048, 8)).astype("float32")
loss = float(np.mean((model.predict(all_features, verbose=0)
                      - (all_features @ true_kernel + 0.5)) ** 2))
print("REPORT " + json.dumps({"rank": rank, "steps": pace.steps, "loss": loss,
                              "initial_kernel": pace.initial_kernel,
                              "probe": probe.numpy().tolist()}), flush=True)
