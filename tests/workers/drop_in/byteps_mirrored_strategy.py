"""BytePS's tensorflow2_mnist_bps_MirroredStrategy.py pattern with `import tf_bps as bps`:
bps.init() and local_rank() first, then bps.distribute.MirroredStrategy(devices=["/gpu:0"])
(on a machine without a GPU, TensorFlow places the replica on the CPU), a model built and
compiled in its scope, and model.fit on an unsharded, repeated dataset."""

import sys

import numpy as np
import tensorflow as tf
from common import report, synthetic_mnist

import tf_bps as bps

bps.init()
print("my local rank", bps.local_rank())
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[bps.local_rank()], "GPU")


def mnist_dataset(batch_size):
    x_train, y_train = synthetic_mnist(seed=0)
    x_train = x_train / np.float32(255)
    return tf.data.Dataset.from_tensor_slices(
        (x_train, y_train.astype(np.int64))).shuffle(512).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
                  metrics=["accuracy"])
    return model


strategy = bps.distribute.MirroredStrategy(devices=["/gpu:0"])
multi_worker_dataset = mnist_dataset(64)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=steps)
report(bps.rank(), multi_worker_model.trainable_variables)
