"""model.fit inside elastic.run, as Horovod's Keras elastic example writes it, in a job
that loses a worker: the per-worker batch and steps follow the job's size (a global
batch of 24), the learning rate is scaled at each reset, and the epoch resumes from
the last commit. Prints EPOCH lines as epochs begin and a REPORT at the end (with the
loss on all the data as each epoch of each fit began).

ELASTIC_FIT_STRATEGY=1: the model is built under tf_bps.ParameterServerStrategy,
which shards fit's input by worker and counts the replicas of the job as it is now."""

import json
import os

import keras
import numpy as np

import tf_bps
import tf_bps.keras as bps

STRATEGY = tf_bps.ParameterServerStrategy() if os.environ.get("ELASTIC_FIT_STRATEGY") else None

bps.init()
EPOCHS, GLOBAL_BATCH, SAMPLES = 4, 24, 480
rng = np.random.default_rng(7)  # the same data everywhere: each worker takes its shard
x = rng.normal(size=(SAMPLES, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")

keras.utils.set_random_seed(bps.rank())  # different starts: the sync makes them equal
if STRATEGY:
    with STRATEGY.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
else:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")


def loss_on_all_data() -> float:
    # The model called directly: the same on every worker, strategy or not.
    return float(np.mean((np.asarray(model(x)) - y) ** 2))


initial_loss = loss_on_all_data()
state = bps.elastic.KerasState(model, batch=0, epoch=0)
shapes = []  # (size, per-worker batch or the strategy's replicas, steps) of each fit


def scale_learning_rate():
    model.optimizer.learning_rate.assign(0.01 * bps.size() / 3)


state.register_reset_callbacks([scale_learning_rate])


epoch_losses = []  # of each fit: the loss at each epoch's beginning


class Announce(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        epoch_losses[-1].append(loss_on_all_data())
        print(f"EPOCH {state.epoch} rank {bps.rank()} size {bps.size()}", flush=True)


@bps.elastic.run
def train(state):
    size, rank = bps.size(), bps.rank()
    steps = SAMPLES // GLOBAL_BATCH
    epoch_losses.append([])
    if STRATEGY:
        # The global batch; the strategy gives each worker its share.
        shapes.append([size, STRATEGY.num_replicas_in_sync, steps])
        data, batch = (x, y), GLOBAL_BATCH
    else:
        shapes.append([size, GLOBAL_BATCH // size, steps])
        data, batch = (x[rank::size], y[rank::size]), GLOBAL_BATCH // size
    model.fit(*data, batch_size=batch, steps_per_epoch=steps,
              epochs=EPOCHS - state.epoch, verbose=0, shuffle=False,
              callbacks=[Announce(), bps.elastic.CommitStateCallback(state, batches_per_commit=5),
                         bps.elastic.UpdateBatchStateCallback(state),
                         bps.elastic.UpdateEpochStateCallback(state)])


train(state)
loss = loss_on_all_data()
print("REPORT " + json.dumps({"rank": bps.rank(), "shapes": shapes, "epoch": state.epoch,
                              "loss": loss, "initial_loss": initial_loss,
                              "epoch_losses": epoch_losses,
                              "weights": [w.tolist() for w in model.get_weights()]}),
      flush=True)
bps.shutdown()
