"""BytePS's compressors in the core, through a real job: each push_pull round against a
numpy model of both legs (every worker's momentum, error feedback and compressed push;
the server's sum, its own error feedback and compressed reply), partition by
partition. The model knows every rank's inputs; compress/decompress are the core's own
(checked against their definitions in test_compression_units.py). Prints a REPORT.

Environment: COMPRESSORS (comma-separated keys of SPECS; all by default), MODES
(eager, graph: how push_pull is called; both by default), INTEGERS=1
(small integer inputs: every sum is exact, so the servers' order of adding cannot
matter), MERGED=1 (the job merges each host's pushes first, BYTEPS_LOCAL_MERGE=1: the
host's sum is what is compressed, once)."""

import json
import os

import compression_model
import numpy as np
import tensorflow as tf

import tf_bps as bps

bps.init()
rank, size = bps.rank(), bps.size()
native = compression_model.native
NUM_SERVERS = int(os.environ["DMLC_NUM_SERVER"])
PARTITION_BYTES = int(os.environ["BYTEPS_PARTITION_BYTES"])
ELEMENTS = 50_000  # 200 KB: four partitions of 64 KB over the servers
ROUNDS = 3
INTEGERS = os.environ.get("INTEGERS") == "1"
MERGED = os.environ.get("MERGED") == "1"
ALL_SPECS = {
    "onebit": bps.Compression.onebit(scaling=True, ef="vanilla"),
    "topk": bps.Compression.topk(0.05, ef="vanilla"),
    "randomk": bps.Compression.randomk(0.05, seed=3, ef="vanilla"),
    "dithering": bps.Compression.dithering(4, ef="vanilla"),
    "nesterov": bps.Compression.topk(0.05, ef="vanilla", momentum="nesterov", mu=0.9),
    "plain": bps.Compression.onebit(),
    # The learning rate falls to a quarter at the last round: each worker's residual is
    # then rescaled by 4 (bps.set_compression_learning_rate before each round).
    "rate": bps.Compression.randomk(0.05, seed=1, ef="vanilla"),
}
RATES = [0.1] * (ROUNDS - 1) + [0.025]
SPECS = {key: ALL_SPECS[key]
         for key in os.environ.get("COMPRESSORS", ",".join(ALL_SPECS)).split(",")}
report = {"rank": rank, "worst": {}, "specs": {k: c.spec for k, c in SPECS.items()}}


def inputs(worker: int, step: int, n: int = ELEMENTS) -> np.ndarray:
    rng = np.random.default_rng(100 * step + worker)
    values = rng.integers(-8, 9, size=n) if INTEGERS else rng.normal(size=n)
    return values.astype("float32")


def partitions(n: int) -> list[tuple[int, int]]:
    return compression_model.partitions(n, PARTITION_BYTES, NUM_SERVERS)


def model(spec: str, name: str, average: bool, rates=None) -> list[np.ndarray]:
    """The results every worker should receive, round by round."""
    rounds = [[inputs(w, r) for w in range(size)] for r in range(1, ROUNDS + 1)]
    if MERGED:  # one sender: the host's sum
        rounds = [[sum(tensors)] for tensors in rounds]
    return compression_model.both_legs(spec, name, rounds, partitions(ELEMENTS), size,
                                       average, rates)


def run(function, name, compression, average=True, n=ELEMENTS, rates=None):
    got = []
    for round_ in range(1, ROUNDS + 1):
        if rates:
            bps.set_compression_learning_rate(rates[round_ - 1])
        mine = tf.constant(inputs(rank, round_, n))
        got.append(function(mine, name, compression, average).numpy())
    return got


def eager(tensor, name, compression, average):
    return bps.push_pull(tensor, average=average, name=name, compression=compression)


graph = tf.function(eager, reduce_retracing=True)

MODES = {"eager": eager, "graph": graph}
MODES = {mode: MODES[mode] for mode in os.environ.get("MODES", "eager,graph").split(",")}
for key, compression in SPECS.items():
    for mode, function in MODES.items():
        name = f"{mode}.{key}"
        rates = RATES if key == "rate" else None
        got = run(function, name, compression, average=key != "plain", rates=rates)
        want = model(compression.spec, name, average=key != "plain", rates=rates)
        exact = [np.mean([inputs(w, r) for w in range(size)], axis=0)
                 for r in range(1, ROUNDS + 1)]
        report["worst"][name] = max(float(np.max(np.abs(g - w)))
                                    for g, w in zip(got, want, strict=True))
        report.setdefault("from_mean", {})[name] = float(np.max(np.abs(got[-1] - exact[-1])))
        if rates:  # the rescaling is what the model tells apart
            unscaled = model(compression.spec, name, average=True)
            report.setdefault("from_unscaled", {})[name] = float(np.max(np.abs(
                got[-1] - unscaled[-1])))

# What the servers should count: each round, each partition's compressed push from
# every sender, and its compressed reply to every worker.
report["wire_bytes"] = {
    f"{mode}.{key}": ROUNDS * sum(
        len(native.compress(compression.spec, np.zeros(hi - lo, "float32")))
        for lo, hi in partitions(ELEMENTS)) for key, compression in SPECS.items()
    for mode in MODES}
report["senders"] = 1 if MERGED else size

# Below BYTEPS_MIN_COMPRESS_BYTES a tensor travels whole: the exact mean.
small = run(eager, "small", ALL_SPECS["topk"], n=1000)[-1]
want = np.mean([inputs(w, ROUNDS, 1000) for w in range(size)], axis=0)
report["small"] = float(np.max(np.abs(small - want)))

refusals = {}
cases = {
    "float64": lambda: bps.push_pull(tf.zeros(ELEMENTS, tf.float64), name="f64",
                                     compression=ALL_SPECS["topk"]),
    "max": lambda: bps.push_pull(tf.zeros(ELEMENTS), name="max", op=bps.Max,
                                 compression=ALL_SPECS["topk"]),
}
for case, call in cases.items():
    try:
        call()
        refusals[case] = "accepted"
    except tf.errors.InvalidArgumentError as error:
        refusals[case] = error.message
report["refusals"] = refusals
bps.shutdown()
print("REPORT " + json.dumps(report), flush=True)
