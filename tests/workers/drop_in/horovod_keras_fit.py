"""Horovod's TF2 Keras MNIST pattern with `import tf_bps.keras as hvd`: a Sequential
without an Input (Keras builds it inside fit), DistributedOptimizer with
average_aggregated_gradients, the broadcast / metric-average / warmup callbacks, and a
ModelCheckpoint on rank 0 only. With BYTEPS_STYLE=1 it is BytePS's variant: the
callbacks take device="GPU:0" and the optimizer no extra arguments."""

import os
import sys

import tensorflow as tf
from common import report, synthetic_mnist

import tf_bps.keras as hvd

hvd.init()
byteps_style = os.environ.get("BYTEPS_STYLE") == "1"

gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

images, labels = synthetic_mnist(seed=hvd.rank())
dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(labels, tf.int64)))
dataset = dataset.repeat().shuffle(1000).batch(32)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(32, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)
if byteps_style:
    opt = hvd.DistributedOptimizer(opt)
else:
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1,
                                   average_aggregated_gradients=True)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              metrics=["accuracy"])

device = {"device": "GPU:0"} if byteps_style else {}
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0, **device),
    hvd.callbacks.MetricAverageCallback(**device),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
]
out = os.environ.get("DROP_IN_OUT")
if hvd.rank() == 0 and out:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(out,
                                                                     "checkpoint-{epoch}.keras")))
verbose = 1 if hvd.rank() == 0 else 0
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
model.fit(dataset, steps_per_epoch=steps // hvd.size(), callbacks=callbacks, epochs=3,
          verbose=verbose)
report(hvd.rank(), model.trainable_variables)
