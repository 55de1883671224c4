"""model.fit under ParameterServerStrategy with BackupAndRestore, in jobs of changing
size that stop and resume from one backup folder, as a job moved between clusters does.

    resize_resume.py BACKUP_DIR EPOCHS STOP_AFTER

Every worker leaves (status 0) when epoch STOP_AFTER ends (0: never), the backup written. The
learning rate is 0.01 x the job's size, as Horovod-style scripts scale it. Prints, on
rank 0, a RESUMED line (the epoch fit starts at, the learning rate and a checksum of the
weights, once the backup is read), an EPOCH line as each epoch begins and a LEFT line
with the checksum when it stops."""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

backup_dir, epochs, stop_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
strategy = bps.ParameterServerStrategy()
size, rank = bps.size(), bps.rank()
rng = np.random.default_rng(3)
x = rng.normal(size=(96, 4)).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")
# The data set is the job's; the strategy gives each worker its shard of every global
# batch, whatever the job's size.
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
with strategy.scope():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01 * size, momentum=0.9), loss="mse")


def checksum() -> float:
    return float(sum(np.sum(np.abs(w)) for w in model.get_weights()))


def say(kind: str, **fields) -> None:
    if rank == 0:
        print(f"{kind} " + json.dumps({"size": size, **fields}), flush=True)


class Watch(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):  # after BackupAndRestore's, which comes first
        say("RESUMED", epoch=self.model._initial_epoch or 0,
            lr=float(self.model.optimizer.learning_rate.numpy()), checksum=checksum())

    def on_epoch_begin(self, epoch, logs=None):
        say("EPOCH", epoch=epoch, lr=float(self.model.optimizer.learning_rate.numpy()))

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == stop_after:
            say("LEFT", epoch=epoch + 1, checksum=checksum())
            raise SystemExit(0)


model.fit(dataset, epochs=epochs, verbose=0,
          callbacks=[keras.callbacks.BackupAndRestore(backup_dir), Watch()])
say("DONE", checksum=checksum())
