"""Keras fit with DistributedOptimizer for 6 batches under BYTEPS_TRACE_ON; then waits
(before shutdown) for this worker's timeline file and prints TRACE WRITTEN once it is
complete: it must not need the job's end."""

import json
import os
import time

import keras
import numpy as np

import tf_bps as bps
import tf_bps.keras as bps_keras

bps.init()
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
rng = np.random.default_rng(bps.rank())
model.fit(rng.normal(size=(48, 8)), rng.normal(size=(48, 1)), batch_size=8, epochs=1,
          verbose=0, callbacks=[bps_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
path = os.path.join(os.environ["BYTEPS_TRACE_DIR"], str(bps.local_rank()), "comm.json")
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    try:
        with open(path) as trace:
            json.load(trace)
        print("TRACE WRITTEN", flush=True)
        break
    except (OSError, ValueError):
        time.sleep(0.1)
