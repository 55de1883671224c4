"""BytePS's compressors (run by the core) through the training API, in one job: the
tape's gradients round by round against a numpy model of both legs (every worker's
error feedback and compressed push, the server's sum, its error feedback and compressed
reply; the core's own compress/decompress, as tests/workers/core_compression.py does),
a fused buffer included; DistributedOptimizer in model.fit and ParameterServerStrategy
(traced and eager) against the same training without compression. Prints a REPORT."""

import hashlib
import json
import os
import time

import compression_model
import keras
import numpy as np
import tensorflow as tf

import tf_bps as bps

bps.init()
rank, size = bps.rank(), bps.size()
NUM_SERVERS = int(os.environ["DMLC_NUM_SERVER"])
PARTITION_BYTES = int(os.environ["BYTEPS_PARTITION_BYTES"])
STEPS = 3
report = {"rank": rank, "seconds": {}}
started = time.monotonic()


def lap(what: str) -> None:  # seconds since init, reported: where a slow job spent them
    report["seconds"][what] = round(time.monotonic() - started, 1)


def model(spec: str, name: str, rounds: list[list[np.ndarray]]) -> list[np.ndarray]:
    """What an averaging push_pull of `name` returns, round by round; rounds[r][w] is
    worker w's flat float32 tensor in round r + 1."""
    parts = compression_model.partitions(rounds[0][0].size, PARTITION_BYTES, NUM_SERVERS)
    return compression_model.both_legs(spec, name, rounds, parts, size)


def gradients(step: int, worker: int, shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 * step + worker)
    return [rng.normal(size=shape).astype("float32") for shape in shapes]


def tape_gradients(variables, mine, name, **arguments):
    # d/dv sum(v * g) is g exactly: the tape's gradients are the given ones.
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, mine, strict=True)])
    tape = bps.DistributedGradientTape(tape, name=name, **arguments)
    return tape.gradient(loss, variables)


def tape_case(name, shapes, function, **arguments):
    """Every step's synchronised gradients (numpy), and every worker's inputs."""
    variables = [tf.Variable(tf.zeros(shape), name=f"v{i}") for i, shape in enumerate(shapes)]
    got, every = [], []
    for step in range(1, STEPS + 1):
        every.append([gradients(step, w, shapes) for w in range(size)])
        mine = [tf.constant(g) for g in every[-1][rank]]
        got.append([g.numpy() for g in function(variables, mine, name, **arguments)])
    return got, every


def worst(a, b) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


# (a) The tape, eagerly: an 80 KB kernel (two partitions, one per server) compressed by
# topk with error feedback; a 400-byte bias under BYTEPS_MIN_COMPRESS_BYTES, whole.
topk = bps.Compression.topk(0.1, ef="vanilla")
got, every = tape_case("Tape", [(200, 100), (100,)], tape_gradients, compression=topk)
want = model(topk.spec, "Tape.0.v0:0", [[w[0].ravel() for w in step] for step in every])
report["kernel"] = worst([g[0].ravel() for g in got], want)
report["bias"] = worst([g[1] for g in got], [np.mean([w[1] for w in step], axis=0)
                                             for step in every])
exact = [np.mean([w[0] for w in step], axis=0) for step in every]
report["kernel_from_mean"] = worst([g[0] for g in got], exact)
kernels = [g[0] for g in got]

lap("tape")

# gradient_predivide_factor=2: halves before the sum, doubles after it divided by the size;
# halving commutes with topk and error feedback, so the results are the same bits.
got, _ = tape_case("Predivide", [(200, 100), (100,)], tape_gradients, compression=topk,
                   gradient_predivide_factor=2.0)
report["predivide"] = worst([g[0] for g in got], kernels)

lap("predivide")

# The tape, traced, from compression_params with Nesterov momentum: three gradients under
# BYTEPS_FUSION_THRESHOLD travel as one fused buffer of 24.4 KB, which the core
# compresses (BYTEPS_MIN_COMPRESS_BYTES=16384) though none of them alone would be.
params = {"compressor": "topk", "k": 0.05, "ef": "vanilla", "momentum": "nesterov",
          "mu": 0.9}
shapes = [(30, 100), (30, 100), (100,)]
got, every = tape_case("Fused", shapes, tf.function(tape_gradients),
                       compression_params=params)
spec = bps.Compression.from_params(params).spec
want = model(spec, "Fused.0.v0:0.fused3",
             [[np.concatenate([g.ravel() for g in w]) for w in step] for step in every])
report["fused"] = worst([np.concatenate([g.ravel() for g in step]) for step in got], want)
report["fused_from_mean"] = worst(
    [np.concatenate([g.ravel() for g in step]) for step in got],
    [np.concatenate([np.mean([w[i] for w in step], axis=0).ravel() for i in range(3)])
     for step in every])

lap("tape_fused")

# (b) DistributedOptimizer in model.fit: 3 SGD steps on each worker's own batch.
rng = np.random.default_rng(10 + rank)
x = rng.normal(size=(32, 100)).astype("float32")
y = rng.normal(size=(32, 4)).astype("float32")


def mlp():
    keras.utils.set_random_seed(3)  # the same initial weights for every model
    return keras.Sequential([keras.Input((100,)), keras.layers.Dense(64, activation="tanh"),
                             keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(4)])


def weights(m) -> np.ndarray:
    return np.concatenate([w.numpy().ravel() for w in m.weights])


def digest(values: np.ndarray) -> str:
    return hashlib.sha256(values.tobytes()).hexdigest()


def fit_optimizer(name, **arguments) -> np.ndarray:
    m = mlp()
    m.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.1), name=name,
                                                 **arguments), loss="mse")
    m.fit(x, y, batch_size=32, epochs=STEPS, shuffle=False, verbose=0)
    return weights(m)


plain = fit_optimizer("Plain")
lap("optimizer_plain")
compressed = fit_optimizer("Compressed", compression=topk)
report["optimizer"] = {"digest": digest(compressed), "from_plain": worst([compressed], [plain]),
                       "finite": bool(np.all(np.isfinite(compressed)))}

lap("optimizer")

# (c) ParameterServerStrategy: plain, then onebit in a traced step (the gradients fused,
# 34.7 KB) and eagerly (each alone: the 25.6 KB kernel is compressed).
xs = np.random.default_rng(20).normal(size=(32, 100)).astype("float32")
ys = np.random.default_rng(21).normal(size=(32, 4)).astype("float32")


def fit_strategy(compression, run_eagerly=False) -> np.ndarray:
    # The rate falls to a quarter at the third step: with error feedback the strategy
    # tells the core each step's rate (the test reads the core's log of it).
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1], [0.1, 0.025])
    with bps.ParameterServerStrategy(compression=compression).scope():
        m = mlp()
        m.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse",
                  run_eagerly=run_eagerly)
    m.fit(xs, ys, batch_size=32, epochs=STEPS, shuffle=False, verbose=0)
    return weights(m)


onebit = bps.Compression.onebit(scaling=True, ef="vanilla")
plain = fit_strategy(bps.Compression.none)
lap("strategy_plain")
for mode, eagerly in (("traced", False), ("eager", True)):
    compressed = fit_strategy(onebit, eagerly)
    lap(f"strategy_{mode}")
    report[f"strategy_{mode}"] = {"digest": digest(compressed),
                                  "from_plain": worst([compressed], [plain]),
                                  "finite": bool(np.all(np.isfinite(compressed)))}


# (d) A process set other than the global one: the servers sum compressed pushes of all
# workers only.
subset = bps.add_process_set([0])
refusals = {}
for case, build in {
    "optimizer_process_set": lambda: bps.DistributedOptimizer(
        keras.optimizers.SGD(0.1), compression=topk, process_set=subset),
    "tape_process_set": lambda: bps.DistributedGradientTape(
        tf.GradientTape(), compression_params={"compressor": "onebit"}, process_set=subset),
}.items():
    try:
        build()
        refusals[case] = "accepted"
    except ValueError as error:
        refusals[case] = str(error)
report["refusals"] = refusals
bps.shutdown()
print("REPORT " + json.dumps(report), flush=True)
