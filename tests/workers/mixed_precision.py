"""Mixed precision across workers (Keras 3), each case its own model, in one process:
model.fit under mixed_float16 with bps.DistributedOptimizer (which compile wraps in a
LossScaleOptimizer), with a LossScaleOptimizer inside and outside it explicitly, and
under mixed_bfloat16; --strategy: under ParameterServerStrategy instead. Under
mixed_float16 one worker's rows overflow float16 at step OVERFLOW: every worker, and one
process on the global batch (--reference), skips the same steps and halves its loss
scale alike. Saves each case's
weights and prints TRAINED per case."""

import argparse
import json
import os

import keras
import numpy as np

FEATURES, BATCH, STEPS, OVERFLOW = 4, 8, 6, 2  # BATCH: per worker
CASES = ["compiled", "inner", "outer", "bfloat16"]


def data(workers, overflow=True):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(STEPS * workers * BATCH, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    if overflow:
        start = OVERFLOW * workers * BATCH + (workers - 1) * BATCH  # the last worker's rows
        x[start:start + BATCH] *= 1e4
    return x, y


def shard(array, rank, workers):
    return np.concatenate([array[s + rank * BATCH:s + (rank + 1) * BATCH]
                           for s in range(0, len(array), workers * BATCH)])


def build(name, policy):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(1234)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8),
                             keras.layers.Dense(1)], name=name)


def optimizer_for(case, bps):
    sgd = keras.optimizers.SGD(0.01)
    if bps is None:
        return sgd  # compile adds the LossScaleOptimizer under mixed_float16
    if case in ("compiled", "bfloat16"):
        return bps.DistributedOptimizer(sgd)
    if case == "inner":
        return keras.optimizers.LossScaleOptimizer(bps.DistributedOptimizer(sgd))
    return bps.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(sgd))


def report(out, name, rank, model):
    np.savez(os.path.join(out, f"{name}.{rank}.npz"), *[w.numpy() for w in model.weights])
    optimizer = model.optimizer
    scale = float(optimizer.dynamic_scale.numpy()) if hasattr(optimizer, "dynamic_scale") \
        else None
    print("TRAINED " + json.dumps({"rank": rank, "case": name, "scale": scale,
                                   "iterations": int(optimizer.iterations.numpy())}),
          flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--strategy", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    bps, rank, workers = None, 0, 2
    if not args.reference:
        import tf_bps as bps

        bps.init()
        rank, workers = bps.rank(), bps.size()
    cases = ["strategy"] if args.strategy else CASES
    for name in cases:
        policy = "mixed_bfloat16" if name == "bfloat16" else "mixed_float16"
        # bfloat16 has float32's range: nothing overflows, and nothing scales the loss.
        x, y = data(workers, overflow=name != "bfloat16")
        if name == "strategy" and bps:
            # The strategy splits each global batch over the workers itself.
            with bps.ParameterServerStrategy().scope():
                model = build(name, policy)
                model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
            model.fit(x, y, batch_size=workers * BATCH, epochs=1, shuffle=False, verbose=0)
        else:
            model = build(name, policy)
            model.compile(optimizer=optimizer_for(name, bps), loss="mse")
            local_x, local_y = (x, y) if bps is None else (shard(x, rank, workers),
                                                          shard(y, rank, workers))
            batch = BATCH if bps else workers * BATCH
            model.fit(local_x, local_y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        report(args.out, name, rank, model)
    if bps:
        bps.shutdown()


if __name__ == "__main__":
    main()
