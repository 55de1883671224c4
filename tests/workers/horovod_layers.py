"""SyncBatchNormalization, Keras's BatchNormalization(synchronized=True) under the strategy,
local layers (partial tape and optimizer, broadcasts that skip them) and
BestModelCheckpoint, each checked against one process computing the same thing on the
global batch; prints a REPORT. argv[1]: a folder for the checkpoints."""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

out = sys.argv[1]
bps.init()
rank, size = bps.rank(), bps.size()
report = {"rank": rank}

GLOBAL_BATCH = 16
rng = np.random.default_rng(0)
x_all = (rng.normal(size=(GLOBAL_BATCH, 5)) * 3 + 1).astype("float32")
y_all = rng.normal(size=(GLOBAL_BATCH, 2)).astype("float32")
half = GLOBAL_BATCH // size
mine = slice(rank * half, (rank + 1) * half)


def build(norm):
    keras.utils.set_random_seed(1)  # The same initial weights everywhere.
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), norm,
                             keras.layers.Dense(2)])


def largest_difference(first, second) -> float:
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(first, second, strict=True))


def mse(model, x, y):
    return tf.reduce_mean(tf.square(model(x, training=True) - y))


# 1. SyncBatchNormalization in a custom loop: this worker's half of the batch,
# normalised with the global batch's statistics; gradients averaged by the tape are
# those of one process on the global batch. Eagerly, then in a tf.function.
reference = build(keras.layers.BatchNormalization())
with tf.GradientTape() as tape:
    reference_outputs = reference(x_all, training=True)
    reference_loss = tf.reduce_mean(tf.square(reference_outputs - y_all))
reference_grads = tape.gradient(reference_loss, reference.trainable_variables)
for mode in ("eager", "function"):
    synced = build(bps.SyncBatchNormalization(fused=False))

    def step(x, y, synced=synced):
        with tf.GradientTape() as tape:
            outputs = synced(x, training=True)
            loss = tf.reduce_mean(tf.square(outputs - y))
        tape = bps.DistributedGradientTape(tape)
        return outputs, tape.gradient(loss, synced.trainable_variables)

    outputs, grads = (tf.function(step) if mode == "function" else step)(x_all[mine],
                                                                        y_all[mine])
    report[f"loop_{mode}"] = {
        "outputs": largest_difference([outputs], [reference_outputs[mine]]),
        "grads": largest_difference(grads, reference_grads),
        "moving": largest_difference(synced.layers[1].non_trainable_weights,
                                     reference.layers[1].non_trainable_weights),
        # Plain BatchNormalization on the half batch is measurably different.
        "unsynced_outputs": largest_difference(
            [build(keras.layers.BatchNormalization())(x_all[mine], training=True)],
            [reference_outputs[mine]])}

# 2. model.fit with DistributedOptimizer: three steps, then every weight (moving
# statistics included) equals one process's after three steps on the global batch.
reference = build(keras.layers.BatchNormalization())
reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
reference.fit(x_all, y_all, batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0)
synced = build(bps.SyncBatchNormalization())
synced.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
synced.fit(x_all[mine], y_all[mine], batch_size=half, epochs=3, shuffle=False, verbose=0)
report["fit_optimizer"] = largest_difference(synced.weights, reference.weights)
# A saved model with the layer loads (the layer is registered with Keras).
path = os.path.join(out, f"sync{rank}.keras")
synced.save(path)
report["loaded_layer"] = type(keras.models.load_model(path).layers[1]).__name__

# 3. BestModelCheckpoint (Horovod style): saves when the monitored value improves, on
# rank 0 only; without a path it is refused when training begins.


class Score(keras.callbacks.Callback):
    SCORES = [3.0, 1.0, 2.0, 0.5]

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.SCORES[epoch]


best = bps.keras.callbacks.BestModelCheckpoint(
    monitor="score", mode="min", filepath=os.path.join(out, f"best-r{rank}-{{epoch}}.keras"))
synced.fit(x_all[mine], y_all[mine], batch_size=half, epochs=4, verbose=0,
           callbacks=[Score(), best])
try:
    synced.fit(x_all[mine], y_all[mine], epochs=1, verbose=0,
               callbacks=[bps.keras.callbacks.BestModelCheckpoint()])
    report["best_without_path"] = None
except ValueError as error:
    report["best_without_path"] = str(error)

# 4. Local layers. PartialDistributedGradientTape: the local layer's gradient is this
# worker's own, scaled by 1/size; the others are averaged. Each rank's own gradient is
# computed here for every rank, so the expectation needs no collective.


def layered():
    keras.utils.set_random_seed(2)
    shared, local = keras.layers.Dense(2, name="shared"), keras.layers.Dense(1, name="local")
    return keras.Sequential([keras.Input((3,)), shared, local]), local


def plain_grads(model, r):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(tf.fill([4, 3], float(r + 1))))
    return tape.gradient(loss, model.trainable_variables)


model, local = layered()
with tf.GradientTape(persistent=True) as tape:
    loss = tf.reduce_mean(model(tf.fill([4, 3], float(rank + 1))))
tape = bps.PartialDistributedGradientTape(tape, local_layers=local)
grads = tape.gradient(loss, model.trainable_variables)
# Horovod's split of the same gradients, by position only (generic names).
local_pairs, global_pairs = tape.get_local_and_global_gradients(
    loss, model.trainable_variables, use_generic_names=True)
own = plain_grads(model, rank)
every_rank = [plain_grads(model, r) for r in range(size)]
averaged = [sum(g) / size for g in zip(*every_rank, strict=True)]
local_ids = {id(v) for v in local.trainable_weights}
expected = [o / size if id(v) in local_ids else a
            for v, o, a in zip(model.trainable_variables, own, averaged, strict=True)]
report["partial_tape"] = largest_difference(grads, expected)
report["split"] = [[v.path.split("/", 1)[1] for v, _ in pairs]  # less the model's name
                   for pairs in (local_pairs, global_pairs)]
report["split_gradients"] = largest_difference(
    [g for _, g in local_pairs + global_pairs],
    [e for v, e in zip(model.trainable_variables, expected, strict=True)
     if id(v) in local_ids] + [e for v, e in zip(model.trainable_variables, expected,
                                                  strict=True) if id(v) not in local_ids])

# PartialDistributedOptimizer with a layer Keras builds only on the first batch; the
# broadcast at the start skips the local layer's variables, whose initial values differ.
keras.utils.set_random_seed(rank + 10)
shared, local = keras.layers.Dense(2, name="shared2"), keras.layers.Dense(1, name="local2")
model = keras.Sequential([shared, local])
model.compile(optimizer=bps.PartialDistributedOptimizer(keras.optimizers.SGD(0.5),
                                                        local_layers=[local]), loss="mse")
model.build((None, 3))
initial = [[w.numpy().tolist() for w in layer.weights] for layer in (shared, local)]


class AtTheStart(keras.callbacks.Callback):
    """The weights the first step starts from (after the broadcast)."""

    def on_train_batch_begin(self, batch, logs=None):
        if batch == 0 and not hasattr(self, "weights"):
            self.weights = [[w.numpy().tolist() for w in layer.weights]
                            for layer in (shared, local)]


start = AtTheStart()
fit_x = np.full((4, 3), rank + 1.0, "float32")
model.fit(fit_x, np.zeros((4, 1), "float32"), batch_size=4, epochs=2, verbose=0,
          callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(
              0, local_variables=local.trainable_weights), start])
report["partial_optimizer"] = {
    "shared": [w.numpy().tolist() for w in shared.weights],
    "local": [w.numpy().tolist() for w in local.weights],
    "initial": initial, "start": start.weights}

# 5. Under the strategy, Keras's own BatchNormalization(synchronized=True) and
# SyncBatchNormalization, trained by fit on the global batch (each worker reads half),
# end as one process would; BestModelCheckpoint writes through rank 0.
strategy = bps.ParameterServerStrategy()
dataset = tf.data.Dataset.from_tensor_slices((x_all, y_all)).batch(GLOBAL_BATCH)
for name, norm in (("keras_synchronized", lambda: keras.layers.BatchNormalization(
        synchronized=True)), ("strategy_sync_layer", bps.SyncBatchNormalization)):
    with strategy.scope():
        model = build(norm())
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(dataset, epochs=3, verbose=0, callbacks=[bps.keras.callbacks.BestModelCheckpoint(
        monitor="loss", filepath=os.path.join(out, f"{name}.keras"))])
    report[name] = largest_difference(model.weights, reference.weights)
# Workers that save different things at once are told so, naming what each saved.
try:
    if rank == 0:
        model.save(os.path.join(out, "mixed.keras"))
    else:
        model.save_weights(os.path.join(out, "mixed.weights.h5"))
    report["mixed_saves"] = None
except ValueError as error:
    report["mixed_saves"] = str(error)
print("REPORT " + json.dumps(report), flush=True)
