"""Time to accuracy with gradient compression on slow links: tf_bps with each compressor
against uncompressed tf_bps and MultiWorkerMirroredStrategy's ring, in one run.

    sudo python examples/benchmarks/compression_benchmark.py [--mbit 100] [--target 0.95]
        [--configs none,fp16,onebit,topk,randomk,dithering,powersgd,ring]
        [--json PATH] [--plot PATH]

4 worker hosts and 4 server hosts of network namespaces (tests/netbed.py), each link
limited to --mbit in each direction. Every configuration trains the same model from the
same weights (an MLP of 1.1 M parameters, 4.4 MB of float32 gradients) on scikit-learn's
digits, 32 images per worker and step, with SGD and momentum, and checks the held-out
accuracy every few steps (that time is not counted) until it reaches --target. For each
it prints the seconds of training to the target, the steps, the bytes worker 0's link
carried per step (both ways, from its interface's counters: what the wire saw,
headers included) and the final accuracy; --json writes the table, --plot draws
accuracy against time.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import jobs
import report

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/digits_data.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from netbed import NetBed  # noqa: E402  (the test bed lives with the tests)

WORKERS, SERVERS = 4, 4
BATCH = 32
EVAL_EVERY = 5
LEARNING_RATE = 0.05
PORT = 29600
CONFIGS = ["none", "fp16", "onebit", "topk", "randomk", "dithering", "powersgd", "ring"]


def compression_of(name: str):
    import tf_bps as bps

    C = bps.Compression
    return {"none": C.none, "fp16": C.fp16,
            "onebit": C.onebit(scaling=True, ef="vanilla"),
            "topk": C.topk(0.01, ef="vanilla"),
            "randomk": C.randomk(0.01, ef="vanilla"),
            "dithering": C.dithering(4, ef="vanilla"),
            "powersgd": C.powersgd(rank=4, start_iter=10)}[name]


def build_model():
    import keras

    keras.utils.set_random_seed(0)  # the same first weights for every configuration
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024, activation="relu"),
                             keras.layers.Dense(1024, activation="relu"),
                             keras.layers.Dense(10)])


def link_bytes() -> int:
    """Bytes this host's link carried, both ways, so far (/proc/net/dev, eth0)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        if line.strip().startswith("eth0:"):
            fields = line.split(":", 1)[1].split()
            return int(fields[0]) + int(fields[8])
    return 0


def train_until(step, model, rank: int, size: int, args) -> dict:
    """Runs `step(images, labels)` on this worker's shard until the held-out accuracy
    reaches the target (every worker stops at the same step: their weights, and so
    their accuracies, are the same) or --max-steps; returns the figures."""
    import digits_data
    import numpy as np

    (x, y), (x_test, y_test), _ = digits_data.load()
    x, x_test = x.reshape(len(x), -1), x_test.reshape(len(x_test), -1)
    x, y = x[rank::size], y[rank::size]
    rng = np.random.default_rng(rank)
    curve, training, steps, accuracy = [], 0.0, 0, 0.0
    before = link_bytes()
    while steps < args.max_steps:
        order = rng.permutation(len(y))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            batch = order[start:start + BATCH]
            began = time.perf_counter()
            step(x[batch], y[batch])
            if steps > 0:  # the first step traces the function: not training time
                training += time.perf_counter() - began
            steps += 1
            if steps % EVAL_EVERY == 0:
                logits = model(x_test, training=False).numpy()
                accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
                curve.append((training, accuracy))
                if accuracy >= args.target:
                    return {"seconds": training, "steps": steps, "accuracy": accuracy,
                            "bytes_per_step": (link_bytes() - before) / steps,
                            "curve": curve, "reached": True}
            if steps >= args.max_steps:
                break
    return {"seconds": training, "steps": steps, "accuracy": accuracy,
            "bytes_per_step": (link_bytes() - before) / steps, "curve": curve,
            "reached": False}


def tf_bps_worker(args) -> None:
    import keras
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    model = build_model()
    optimizer = keras.optimizers.SGD(LEARNING_RATE, momentum=0.9)
    compression = compression_of(args.config)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = bps.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    figures = train_until(step, model, bps.rank(), bps.size(), args)
    if bps.rank() == 0:
        Path(args.out).write_text(json.dumps(figures))
    bps.shutdown()


def mwms_worker(args) -> None:
    import keras
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(LEARNING_RATE, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def replicated_step(images, labels):
        def replica_step(images, labels):
            with tf.GradientTape() as tape:
                per_example = loss_fn(labels, model(images, training=True))
                loss = tf.nn.compute_average_loss(per_example,
                                                  global_batch_size=BATCH * WORKERS)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

        strategy.run(replica_step, args=(images, labels))

    def step(images, labels):
        replicated_step(tf.constant(images), tf.constant(labels))

    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    figures = train_until(step, model, task, WORKERS, args)
    if jobs.is_mwms_chief():
        Path(args.out).write_text(json.dumps(figures))


def run_tf_bps(bed: NetBed, config: str, args, scratch: str) -> dict:
    """Workers on hosts 0-3, servers on hosts 4-7 (the scheduler with the first)."""
    out = os.path.join(scratch, f"{config}.json")
    launch = [sys.executable, "-m", "tf_bps.launch"]
    worker = [*launch, sys.executable, __file__, "--role", "tf_bps", "--config", config,
              "--out", out, "--target", str(args.target), "--max-steps", str(args.max_steps)]
    env = {**os.environ, "DMLC_PS_ROOT_URI": bed.address(WORKERS),
           "DMLC_PS_ROOT_PORT": str(PORT), "DMLC_NUM_WORKER": str(WORKERS),
           "DMLC_NUM_SERVER": str(SERVERS), "TF_CPP_MIN_LOG_LEVEL": "3",
           "BYTEPS_JOB_TOKEN": secrets.token_hex(16)}
    roles = [(WORKERS, launch, {"DMLC_ROLE": "scheduler"})]
    roles += [(WORKERS + i, launch, {"DMLC_ROLE": "server"}) for i in range(SERVERS)]
    roles += [(host, worker, {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(host)})
              for host in range(WORKERS)]
    jobs.run_processes([(bed.command(host, command), {**env, **extra})
                        for host, command, extra in roles])
    return json.loads(Path(out).read_text())


def run_ring(bed: NetBed, args, scratch: str) -> dict:
    out = os.path.join(scratch, "ring.json")
    command = [sys.executable, __file__, "--role", "mwms", "--out", out, "--target",
               str(args.target), "--max-steps", str(args.max_steps)]
    return jobs.run_mwms(command, out, WORKERS, bed=bed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbit", type=float, default=100, help="link rate per host and way")
    parser.add_argument("--target", type=float, default=0.95, help="held-out accuracy")
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    report.add_arguments(parser)
    parser.add_argument("--role", choices=["tf_bps", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "tf_bps":
        return tf_bps_worker(args)
    if args.role == "mwms":
        return mwms_worker(args)

    configs = args.configs.split(",")
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configurations {unknown}; choose from {CONFIGS}")
    seconds = report.Report(f"seconds of training to {args.target:.0%} held-out accuracy, "
                            f"{WORKERS} workers, {args.mbit:g} Mbit/s links", unit="s",
                            higher_is_better=False)
    traffic = report.Report("bytes per step on worker 0's link (both ways)", unit="MB",
                            higher_is_better=False)
    accuracy = report.Report("held-out accuracy at the end", unit="accuracy")
    results = {}
    with NetBed(hosts=WORKERS + SERVERS, mbit=args.mbit) as bed, \
            tempfile.TemporaryDirectory() as scratch:
        print(f"{WORKERS} worker hosts, {SERVERS} server hosts, {args.mbit:g} Mbit/s links; "
              f"target {args.target:.0%} on scikit-learn's digits")
        print(f"{'configuration':>12}  {'seconds':>8}  {'steps':>5}  {'MB/step':>8}  "
              f"{'accuracy':>8}  {'vs none':>7}")
        for config in configs:
            figures = (run_ring(bed, args, scratch) if config == "ring"
                       else run_tf_bps(bed, config, args, scratch))
            results[config] = figures
            base = results.get("none")
            speedup = (f"{base['seconds'] / figures['seconds']:6.2f}x"
                       if base and base["reached"] and figures["reached"] else "      -")
            mark = "" if figures["reached"] else " (target not reached)"
            print(f"{config:>12}  {figures['seconds']:8.1f}  {figures['steps']:5d}  "
                  f"{figures['bytes_per_step'] / 1e6:8.3f}  {figures['accuracy']:8.3f}  "
                  f"{speedup}{mark}", flush=True)
            seconds.add(config, "seconds to target", figures["seconds"])
            traffic.add(config, "MB per step", figures["bytes_per_step"] / 1e6)
            accuracy.add(config, "accuracy", figures["accuracy"])
    # --plot draws accuracy against time (the curves), not report.py's bars.
    report.save(argparse.Namespace(json=args.json, plot=None), seconds, traffic, accuracy)
    if args.plot:
        plot_curves(args.plot, results, args)


def plot_curves(path: str, results: dict, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for config, figures in results.items():
        times, accuracies = zip(*figures["curve"], strict=True) if figures["curve"] else ((), ())
        axes.plot(times, accuracies, label=config)
    axes.axhline(args.target, color="grey", linestyle=":")
    axes.set_xlabel("seconds of training")
    axes.set_ylabel("held-out accuracy")
    axes.set_title(f"{WORKERS} workers, {args.mbit:g} Mbit/s links")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    print(f"accuracy against time: {path}")


if __name__ == "__main__":
    main()
