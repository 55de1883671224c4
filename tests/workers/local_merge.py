"""What a job of several workers per host computes, saved for the test to compare
with numpy and with the same job without the local merge: multi-partition sums and
averages, a grouped allreduce, a broadcast and an allgather next to them, and a few
steps of Keras training with DistributedOptimizer. Writes TEST_OUT/rank<r>.npz."""

import os

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

bps.init()
rank, size = bps.rank(), bps.size()
results = {}
ELEMENTS = 300_000  # several partitions, over both servers
for step in range(3):
    mine = np.arange(ELEMENTS, dtype=np.float32) % 97 + 1000 * rank + step
    results[f"sum{step}"] = bps.push_pull(tf.constant(mine), op=bps.Sum, name="big").numpy()
results["average"] = bps.push_pull(tf.fill([1000], float(4 * rank)), name="avg").numpy()
grouped = bps.grouped_allreduce([tf.fill([7], float(rank)), tf.fill([3, 3], 2.0 * rank)],
                                op=bps.Sum, name="grouped")
results["grouped0"], results["grouped1"] = grouped[0].numpy(), grouped[1].numpy()
results["broadcast"] = bps.broadcast(tf.fill([5], float(rank)), root_rank=size - 1,
                                     name="bcast").numpy()
results["allgather"] = bps.allgather(tf.fill([rank + 1, 2], float(rank)), name="rows").numpy()

keras.utils.set_random_seed(7)  # the same initial weights everywhere
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(0.05))
model.compile(optimizer=optimizer, loss="mse")
data = np.random.default_rng(rank).normal(size=(64, 8)).astype(np.float32)
model.fit(data, data.sum(axis=1, keepdims=True), batch_size=16, epochs=2, verbose=0,
          shuffle=False)
for i, weight in enumerate(model.get_weights()):
    results[f"weight{i}"] = weight

np.savez(os.path.join(os.environ["TEST_OUT"], f"rank{rank}.npz"), **results)
print("DONE", rank, flush=True)
bps.shutdown()
