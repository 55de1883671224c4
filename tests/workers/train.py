"""Trains a small Keras model one of several ways and saves the final weights.

Run under bpslaunch for the distributed modes (each worker gets its batch-size share
of every global batch), or with --reference as one plain process on whole global
batches: both must end with the same weights.
"""

import argparse
import json
import os

import keras
import numpy as np
import tensorflow as tf

FEATURES, BATCH, STEPS = 4, 8, 6  # BATCH: per worker and per backward pass.


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["fit", "fit_eager", "tape", "tape_function",
                                           "loop_optimizer", "strategy"], default="fit")
    parser.add_argument("--local-replicas", type=int, default=1,
                        help="logical CPU devices, for --mode strategy")
    parser.add_argument("--optimizer", choices=["sgd", "adam", "adamw_schedule_clip",
                                                "loss_scale"], default="sgd")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--compression", choices=["none", "fp16"], default="none")
    parser.add_argument("--workers", type=int, default=2, help="with --reference")
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", default="",
                        help="mode/optimizer/passes/compression,...: trains each case in "
                             "turn, in one process (one job), into OUT/<its index>; "
                             "every case's model is named case<index>, and so are its "
                             "gradients. Not --mode strategy.")
    return parser.parse_args()


def data(workers, passes):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * workers * passes * BATCH, FEATURES)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None] + 0.1
    return x, y


def shard(array, rank, workers, passes):
    """This worker's micro-batches, in the order it trains on them."""
    update = workers * passes * BATCH
    rows = []
    for start in range(0, len(array), update):
        for p in range(passes):
            offset = start + (p * workers + rank) * BATCH
            rows.append(array[offset:offset + BATCH])
    return np.concatenate(rows)


def build(name=None):
    keras.utils.set_random_seed(1234)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)], name=name)
    return model


def make_optimizer(name):
    if name == "sgd":
        return keras.optimizers.SGD(0.05, momentum=0.9)
    if name == "adam":
        return keras.optimizers.Adam(0.01)
    if name == "adamw_schedule_clip":
        schedule = keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=2,
                                                               decay_rate=0.8)
        return keras.optimizers.AdamW(schedule, weight_decay=0.01, clipnorm=0.5)
    return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05),
                                               initial_scale=2.0**10)


def main():
    args = parse()
    if args.local_replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.local_replicas)
    if args.cases:
        return train_cases(args)
    if args.mode == "strategy" and not args.reference:
        return train_with_strategy(args)
    bps = None
    if not args.reference:
        import tf_bps as bps

        bps.init()
    train(args, bps)
    if bps:
        bps.shutdown()


def train_cases(args):
    """Each case of --cases in turn, as one process trains it alone."""
    bps = None
    if not args.reference:
        import tf_bps as bps

        bps.init()
    for index, case in enumerate(args.cases.split(",")):
        mode, optimizer, passes, compression = case.split("/")
        if mode == "strategy":
            raise SystemExit("--cases cannot hold --mode strategy: it runs alone")
        out = os.path.join(args.out, str(index))
        os.makedirs(out, exist_ok=True)
        train(argparse.Namespace(**{**vars(args), "mode": mode, "optimizer": optimizer,
                                    "passes": int(passes), "compression": compression,
                                    "out": out}), bps, name=f"case{index}")
    if bps:
        bps.shutdown()


def train(args, bps, name=None):
    """Trains one case; `bps` is the initialised tf_bps, or None for the reference."""
    if bps is None:
        rank, workers = 0, args.workers
        x, y = data(workers, args.passes)
        batch = workers * args.passes * BATCH
    else:
        rank, workers = bps.rank(), bps.size()
        x, y = data(workers, args.passes)
        x, y = shard(x, rank, workers, args.passes), shard(y, rank, workers, args.passes)
        batch = BATCH
    model = build(name)
    optimizer = make_optimizer(args.optimizer)
    if bps and (args.mode.startswith("fit") or args.mode == "loop_optimizer"):
        compression = bps.Compression.fp16 if args.compression == "fp16" else bps.Compression.none
        optimizer = bps.DistributedOptimizer(optimizer, backward_passes_per_step=args.passes,
                                             average_aggregated_gradients=True,
                                             compression=compression)
    loss_fn = keras.losses.MeanSquaredError()
    np.savez(os.path.join(args.out, f"init{rank}.npz"), *[w.numpy() for w in model.weights])
    losses = {}
    if args.mode.startswith("fit") or args.mode == "strategy":
        model.compile(optimizer=optimizer, loss=loss_fn, run_eagerly=args.mode == "fit_eager")
        history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        losses["loss"] = history.history["loss"][-1]
    else:
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            if bps and args.mode != "loop_optimizer":  # There the optimizer synchronises.
                compression = (bps.Compression.fp16 if args.compression == "fp16"
                               else bps.Compression.none)
                tape = bps.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        if args.mode in ("tape_function", "loop_optimizer"):
            step = tf.function(step)
        for start in range(0, len(x), batch):
            step(tf.constant(x[start:start + batch]), tf.constant(y[start:start + batch]))
    if not args.mode.startswith("tape"):  # there the optimizer is the plain one
        losses["iterations"] = int(optimizer.iterations.numpy())
    save(args.out, rank, workers, model, case=name, **losses)


def save(out, rank, workers, model, **extra):
    np.savez(os.path.join(out, f"rank{rank}.npz"), *[w.numpy() for w in model.weights])
    print("TRAINED " + json.dumps({"rank": rank, "size": workers, **extra}), flush=True)


def train_with_strategy(args):
    """model.fit under ParameterServerStrategy on the whole data set: the strategy
    shards it by worker and splits each global batch over all replicas."""
    import tf_bps as bps

    strategy = bps.ParameterServerStrategy()
    workers = bps.size()
    x, y = data(workers, 1)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(workers * BATCH)
    with strategy.scope():
        model = build()
        model.compile(optimizer=make_optimizer(args.optimizer), loss="mse")
    np.savez(os.path.join(args.out, f"init{bps.rank()}.npz"), *[w.numpy() for w in model.weights])
    history = model.fit(dataset, epochs=1, verbose=0)
    save(args.out, bps.rank(), workers, model, replicas=strategy.num_replicas_in_sync,
         loss=history.history["loss"][-1])
    bps.shutdown()


if __name__ == "__main__":
    main()
