"""The synthetic-benchmark pattern of Horovod (tensorflow2_synthetic_benchmark.py) and
BytePS (synthetic_benchmark_tf2.py) with `import tf_bps as hvd`: a keras.applications
model, constant random data captured by a tf.function step that takes a Python bool,
DistributedGradientTape with optional fp16 compression, broadcasts after the first
step, timeit loops under tf.device. `--float-labels` is BytePS's float64 target."""

import argparse
import os
import timeit

import numpy as np
import tensorflow as tf
from common import report
from tensorflow.keras import applications

import tf_bps as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--float-labels", action="store_true")
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=2)
parser.add_argument("--num-iters", type=int, default=2)
args = parser.parse_args()

hvd.init()
os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

# The examples' ResNet50 would take minutes on CPU; the smallest MobileNet has its
# pattern (convolutions, batch norms, a classifier: 83 variables) at half the layers of
# MobileNetV2, so its tf.function traces in half the time.
model = applications.MobileNet(weights=None, input_shape=(32, 32, 3), classes=10, alpha=0.25)
opt = tf.optimizers.SGD(0.01)
data = tf.random.uniform([args.batch_size, 32, 32, 3])
label_dtype = tf.float64 if args.float_labels else tf.int64
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=9, dtype=label_dtype)


@tf.function
def benchmark_step(first_batch):
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, probs)
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)


def log(text):
    if hvd.rank() == 0:
        print(text)


log(f"Number of CPUs: {hvd.size()}")
with tf.device("CPU"):
    benchmark_step(first_batch=True)
    timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)
    rates = []
    for iteration in range(args.num_iters):
        seconds = timeit.timeit(lambda: benchmark_step(first_batch=False),
                                number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        log(f"Iter #{iteration}: {rates[-1]:.1f} img/sec per CPU")
    log(f"Img/sec per CPU: {np.mean(rates):.1f} +-{1.96 * np.std(rates):.1f}")
report(hvd.rank(), model.trainable_variables)
