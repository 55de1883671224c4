"""Horovod's TF2 custom-loop MNIST pattern with `import tf_bps as hvd`: a Sequential
built lazily inside a tf.function, DistributedGradientTape, and broadcast_variables of
the model and the optimizer inside the function after the first step (a Python bool
argument selects that trace); rank 0 saves a tf.train.Checkpoint."""

import os
import sys

import tensorflow as tf
from common import report, synthetic_mnist

import tf_bps as hvd

hvd.init()

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
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation="softmax"),
])
loss_fn = tf.losses.SparseCategoricalCrossentropy()
opt = tf.optimizers.Adam(0.001 * hvd.size())
checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)
jit = os.environ.get("DROP_IN_JIT") == "1"  # BytePS's variant compiles the step with XLA.


@tf.function(jit_compile=True if jit else None)
def training_step(batch_images, batch_labels, first_batch):
    with tf.GradientTape() as tape:
        probabilities = model(batch_images, training=True)
        loss_value = loss_fn(batch_labels, probabilities)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
    return loss_value


steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
for batch, (batch_images, batch_labels) in enumerate(dataset.take(steps)):
    loss_value = training_step(batch_images, batch_labels, batch == 0)
    if batch % 5 == 0 and hvd.local_rank() == 0:
        print(f"Step #{batch}\tLoss: {float(loss_value):.6f}")

if hvd.rank() == 0 and os.environ.get("DROP_IN_OUT"):
    checkpoint.save(os.path.join(os.environ["DROP_IN_OUT"], "checkpoints"))
report(hvd.rank(), model.trainable_variables, local_rank=hvd.local_rank(),
       local_size=hvd.local_size())
