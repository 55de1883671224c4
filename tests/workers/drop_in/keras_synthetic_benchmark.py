"""Horovod's tensorflow2_keras_synthetic_benchmark.py pattern with
`import tf_bps.keras as hvd`: build facts (sycl_built) for GPU pinning, a
keras.applications model, DistributedOptimizer with compression, model.fit with the
broadcast and metric-average callbacks and a timing callback on rank 0."""

import argparse
from timeit import default_timer as timer

import numpy as np
import tensorflow as tf
from common import report
from tensorflow.keras import applications

import tf_bps.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--num-batches-per-iter", type=int, default=2)
parser.add_argument("--num-iters", type=int, default=3)
args = parser.parse_args()

hvd.init()
device_name = "XPU" if hvd.sycl_built() else "GPU"
gpus = tf.config.experimental.list_physical_devices(device_name)
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], device_name)

# The examples' ResNet50 would take minutes on CPU; the smallest MobileNet has its
# pattern (convolutions, batch norms, a classifier: 83 variables) at half the layers of
# MobileNetV2, so its tf.function traces in half the time.
model = applications.MobileNet(weights=None, input_shape=(32, 32, 3), classes=10, alpha=0.25)
data = tf.random.uniform([args.batch_size, 32, 32, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=9, dtype=tf.int64)
dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(
    args.batch_size)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
opt = hvd.DistributedOptimizer(tf.optimizers.SGD(0.01), compression=compression)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt)
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
             hvd.callbacks.MetricAverageCallback()]


class Timing(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.rates = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = timer()

    def on_epoch_end(self, epoch, logs=None):
        rate = args.batch_size * args.num_batches_per_iter / (timer() - self.start)
        print(f"Iter #{epoch}: {rate:.1f} img/sec per CPU")
        if epoch > 0:
            self.rates.append(rate)

    def on_train_end(self, logs=None):
        print(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * np.mean(self.rates):.1f}")


if hvd.rank() == 0:
    callbacks.append(Timing())
model.fit(dataset, batch_size=args.batch_size, steps_per_epoch=args.num_batches_per_iter,
          callbacks=callbacks, epochs=args.num_iters, verbose=0)
report(hvd.rank(), model.trainable_variables)
