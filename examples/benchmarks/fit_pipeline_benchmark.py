"""ResNet-50 under `model.fit`, its gradients synchronised two ways in one run: under
tf_bps.ParameterServerStrategy and through bps.DistributedOptimizer (no strategy).

    sudo python examples/benchmarks/fit_pipeline_benchmark.py [--mbit 400] [--workers 4]
        [--servers 4] [--image 64] [--batch 4] [--steps 8] [--rounds 2] [--json PATH]

Both train Keras' ResNet-50 (25.6 M parameters, 214 gradients) on synthetic images of
--image pixels a side, --batch per worker, with SGD; one worker per host and each server
on a host of its own (tests/netbed.py, every link limited to --mbit each way). The
variants alternate for --rounds rounds, so that both see the same machine. Printed: the
median step time of each, and how much of a step's communication overlaps the backward
pass, read from the timeline (BYTEPS_TRACE_ON): the share of the time a partition was on
the network (PUSH or PULL) before the step's last gradient was handed to the core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import jobs
import report

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from copy_overlap import union  # noqa: E402  (the timeline's tools)
from netbed import NetBed  # noqa: E402  (the test bed lives with the tests)

WARMUP = 3
VARIANTS = ("strategy", "optimizer")


def worker(args) -> None:
    import keras
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    keras.utils.set_random_seed(0)
    shape = (args.image, args.image, 3)
    images = tf.random.stateless_uniform([args.batch, *shape], seed=[1, bps.rank()])
    labels = tf.random.stateless_uniform([args.batch], seed=[2, bps.rank()], maxval=1000,
                                         dtype=tf.int64)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
    loss = keras.losses.SparseCategoricalCrossentropy()
    if args.variant == "strategy":
        strategy = bps.ParameterServerStrategy()
        # Each worker reads its own batch: the strategy's batch is global.
        dataset = dataset.unbatch().batch(args.batch * bps.size())
        with strategy.scope():
            model = keras.applications.ResNet50(weights=None, input_shape=shape)
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
    else:
        model = keras.applications.ResNet50(weights=None, input_shape=shape)
        model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                      loss=loss)

    class StepTimes(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.ends = [time.perf_counter()]

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    times = StepTimes()
    model.fit(dataset, steps_per_epoch=WARMUP + args.steps, epochs=1, verbose=0,
              callbacks=[times])
    steps = [b - a for a, b in zip(times.ends, times.ends[1:], strict=False)][WARMUP:]
    if bps.rank() == 0:
        Path(args.out).write_text(json.dumps({"seconds": statistics.median(steps)}))


def backward_overlap(trace_dir: Path) -> float:
    """Over the traced steps: the share of network time (any partition in PUSH or PULL)
    before the step's last operation started. Eager operations (Keras's, between
    epochs) are left out: they run outside the traced step."""
    steps = defaultdict(lambda: {"queued": [], "network": []})
    for path in Path(trace_dir).rglob("*.json"):
        for event in json.loads(path.read_text())["traceEvents"]:
            if ".eager" in event["pid"]:
                continue
            step = steps[path, event["args"]["step"]]
            if event["tid"] == "total":
                step["queued"].append(event["ts"])
            elif event["name"].rsplit(".", 1)[1] in ("PUSH", "PULL"):
                step["network"].append((event["ts"], event["ts"] + event["dur"]))
    network = before = 0
    for step in steps.values():
        if not step["queued"]:
            continue
        last_queued = max(step["queued"])
        for begin, end in union(step["network"]):
            network += end - begin
            before += max(0, min(end, last_queued) - begin)
    return before / network if network else float("nan")


def run(bed: NetBed, args, variant: str, scratch: str, round_: int) -> tuple[float, float]:
    out = os.path.join(scratch, f"{variant}-{round_}.json")
    traces = os.path.join(scratch, f"traces-{variant}-{round_}")
    command = [sys.executable, __file__, "--variant", variant, "--out", out,
               "--image", str(args.image), "--batch", str(args.batch),
               "--steps", str(args.steps)]
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_DIR": traces,
           "BYTEPS_TRACE_START_STEP": str(WARMUP + 1),
           "BYTEPS_TRACE_END_STEP": str(WARMUP + args.steps)}
    seconds = jobs.run_tf_bps_hosts(command, out, args.workers, 1, args.servers, env=env,
                                    bed=bed)["seconds"]
    return seconds, backward_overlap(Path(traces))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbit", type=float, default=400, help="link rate per host and way")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--image", type=int, default=64, help="pixels a side")
    parser.add_argument("--batch", type=int, default=4, help="images per worker and step")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per job")
    parser.add_argument("--rounds", type=int, default=2, help="jobs per variant")
    parser.add_argument("--keep-traces", help="a folder to keep the jobs' timelines in")
    report.add_arguments(parser)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        return worker(args)

    times = report.Report(f"ResNet-50 model.fit step, {args.workers} worker hosts, "
                          f"{args.servers} server hosts, {args.mbit:g} Mbit/s links",
                          unit="s", higher_is_better=False)
    results = defaultdict(list)
    with NetBed(hosts=args.workers + args.servers, mbit=args.mbit) as bed, \
            tempfile.TemporaryDirectory() as scratch:
        scratch = args.keep_traces or scratch
        for round_ in range(args.rounds):
            for variant in VARIANTS:
                seconds, overlap = run(bed, args, variant, scratch, round_)
                results[variant].append((seconds, overlap))
                print(f"round {round_ + 1} {variant:>9}: {seconds:6.3f} s/step, "
                      f"{overlap:5.1%} of the network time overlaps the backward pass",
                      flush=True)
    print(f"\n{'variant':>9}  {'s/step':>7}  {'overlap':>7}  (median of {args.rounds} jobs, "
          f"each the median of {args.steps} steps)")
    medians = {}
    for variant in VARIANTS:
        medians[variant] = statistics.median(s for s, _ in results[variant])
        overlap = statistics.median(o for _, o in results[variant])
        times.add("ResNet-50", variant, medians[variant])
        print(f"{variant:>9}  {medians[variant]:7.3f}  {overlap:7.1%}")
    print(f"strategy / optimizer: {medians['strategy'] / medians['optimizer']:.3f}")
    report.save(args, times)


if __name__ == "__main__":
    main()
