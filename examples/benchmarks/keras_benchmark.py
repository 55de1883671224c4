"""Images per second of a synthetic-data CNN on 2 workers: model.fit under
tf_bps.ParameterServerStrategy against MultiWorkerMirroredStrategy, in one run.

    python examples/benchmarks/keras_benchmark.py [--batch-size 64] [--steps 30]
        [--json PATH] [--plot PATH]

Both sides train the same model with the same optimizer, per-worker batch and number of
processes. `model.fit` under MultiWorkerMirroredStrategy fails on CPU with TensorFlow 2.21
and Keras 3 before its first step, so the peer runs a tf.function step that calls
strategy.run with that model and optimizer, which is the loop fit would run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import jobs
import report

NUM_WORKERS = 2


def build_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])


def make_optimizer():
    import keras

    return keras.optimizers.SGD(0.01, momentum=0.9)


def synthetic_dataset(global_batch: int):
    import tensorflow as tf

    images = tf.random.stateless_uniform([global_batch, 32, 32, 3], seed=[1, 2])
    labels = tf.random.stateless_uniform([global_batch], seed=[3, 4], maxval=10, dtype=tf.int64)
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


def tf_bps_worker(args) -> None:
    import keras

    import tf_bps as bps

    strategy = bps.ParameterServerStrategy()
    global_batch = args.batch_size * bps.size()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=make_optimizer(),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.elapsed = time.perf_counter() - self.start

    timer = EpochTimer()
    dataset = synthetic_dataset(global_batch)
    model.fit(dataset, steps_per_epoch=args.warmup, epochs=1, verbose=0)
    model.fit(dataset, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[timer])
    if bps.rank() == 0:
        with open(args.out, "w") as out:
            json.dump({"images_per_second": global_batch * args.steps / timer.elapsed}, out)
    bps.shutdown()


def mwms_worker(args) -> None:
    import keras
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    with strategy.scope():
        model = build_model()
        optimizer = make_optimizer()
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    iterator = iter(strategy.experimental_distribute_dataset(synthetic_dataset(global_batch)))

    @tf.function
    def train_step(batch):
        def replica_step(images, labels):
            with tf.GradientTape() as tape:
                per_example = loss_fn(labels, model(images, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    for _ in range(args.warmup):
        train_step(next(iterator)).numpy()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = train_step(next(iterator))
    loss.numpy()
    elapsed = time.perf_counter() - start
    if jobs.is_mwms_chief():
        with open(args.out, "w") as out:
            json.dump({"images_per_second": global_batch * args.steps / elapsed}, out)


def worker_command(args, role: str, out: str) -> list[str]:
    return [sys.executable, __file__, "--role", role, "--out", out, "--batch-size",
            str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    report.add_arguments(parser)
    parser.add_argument("--role", choices=["tf_bps", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.role == "tf_bps":
        return tf_bps_worker(args)
    if args.role == "mwms":
        return mwms_worker(args)
    with tempfile.TemporaryDirectory() as scratch:
        mine, theirs = os.path.join(scratch, "tf_bps.json"), os.path.join(scratch, "mwms.json")
        ours = jobs.run_tf_bps(worker_command(args, "tf_bps", mine), mine,
                               NUM_WORKERS)["images_per_second"]
        peer = jobs.run_mwms(worker_command(args, "mwms", theirs), theirs,
                             NUM_WORKERS)["images_per_second"]
    print(f"{NUM_WORKERS} workers, batch {args.batch_size} per worker, {args.steps} timed steps")
    print(f"tf_bps ParameterServerStrategy (model.fit): {ours:8.1f} images/s")
    print(f"MultiWorkerMirroredStrategy (RING):         {peer:8.1f} images/s")
    print(f"ratio tf_bps / MWMS: {ours / peer:.2f}x")
    throughput = report.Report(f"training throughput, {NUM_WORKERS} workers, {args.steps} "
                               "timed steps", unit="images/s", higher_is_better=True)
    case = f"synthetic-data CNN, batch {args.batch_size} per worker"
    throughput.add(case, "tf_bps ParameterServerStrategy (model.fit)", ours)
    throughput.add(case, "MultiWorkerMirroredStrategy", peer)
    report.save(args, throughput)


if __name__ == "__main__":
    main()
