"""Priority scheduling, measured: a synthetic training step replaying ResNet-50's
gradients under a bandwidth limit, with and without priorities and scheduling credit.

    sudo python examples/benchmarks/priority_benchmark.py [--mbit 200] [--scale 0.25]
        [--backward-ms 600] [--forward-ms 300] [--json PATH] [--plot PATH]

Each step runs the backward pass layer by layer from the last (a fixed compute time per
layer), starting each layer's push_pull as its gradient is ready, then the next forward
pass from the first layer, which waits for that layer's sum before computing. The
gradient sizes are Keras' ResNet-50's (214 tensors, 25.6 M parameters), times --scale.

Two worker hosts and two server hosts (tests/netbed.py, every link limited to --mbit),
the job started with `bpslaunch -H` over ssh. Variants:
    FIFO        tensors ranked in the order the backward pass produces them, so the
                first layers, which the forward pass needs first, come last
    priority    ranked in the model's order (what DistributedOptimizer declares): the
                first layers' sums overtake the rest
each with BYTEPS_SCHEDULING_CREDIT=0 (everything pushed at once) and the default
credit (partitions held back at the worker, where priority can still reorder them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import jobs  # noqa: E402
import report  # noqa: E402
from netbed import NetBed, SshHosts  # noqa: E402  (the test bed lives with the tests)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
WARMUP, STEPS = 2, 5
VARIANTS = [("FIFO", "backward", "0"), ("FIFO", "backward", None),
            ("priority", "forward", "0"), ("priority", "forward", None)]


def resnet50_sizes() -> list[int]:
    """Elements of each trainable variable of Keras' ResNet-50, in the model's order."""
    import keras
    import numpy as np

    model = keras.applications.ResNet50(weights=None)
    return [int(np.prod(v.shape)) for v in model.trainable_variables]


def worker(args) -> None:
    import tensorflow as tf

    import tf_bps as bps
    from tf_bps.runtime import basics

    bps.init()
    sizes = [max(1, int(n * args.scale)) for n in resnet50_sizes()]
    layers = len(sizes)
    names = [f"layer{i:03d}" for i in range(layers)]
    grads = [tf.ones([n]) for n in sizes]
    # The ranking under test: the order tensors are declared in is their priority.
    basics.declare(names if args.order == "forward" else names[::-1])
    backward_s, forward_s = args.backward_ms / 1e3 / layers, args.forward_ms / 1e3 / layers

    def push_pull(i):
        return bps.push_pull(grads[i], name=names[i], op=bps.Sum).numpy()[0]

    pool = ThreadPoolExecutor(max_workers=layers)
    samples = []
    for _ in range(WARMUP + STEPS):
        start = time.perf_counter()
        sums = [None] * layers
        for i in reversed(range(layers)):  # backward: the last layer's gradient first
            time.sleep(backward_s)
            sums[i] = pool.submit(push_pull, i)
        for i in range(layers):  # the next forward pass needs layer i's update now
            if sums[i].result() != bps.size():
                raise SystemExit(f"layer {i}: wrong sum {sums[i].result()}")
            time.sleep(forward_s)
        samples.append(time.perf_counter() - start)
    if bps.rank() == 0:
        Path(args.out).write_text(json.dumps({"seconds": statistics.median(samples[WARMUP:])}))
    pool.shutdown()
    bps.shutdown()


def run_variant(bed: NetBed, ssh: SshHosts, args, order: str, credit: str | None,
                out: str) -> float:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("BYTEPS_SCHEDULING_CREDIT", None)
    if credit is not None:
        env["BYTEPS_SCHEDULING_CREDIT"] = credit
    worker = [sys.executable, __file__, "--role", "worker", "--order", order, "--out", out,
              "--scale", str(args.scale), "--backward-ms", str(args.backward_ms),
              "--forward-ms", str(args.forward_ms)]
    return jobs.run_tf_bps_over_ssh(bed, ssh, worker, out, env)["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbit", type=float, default=200, help="link rate per host and way")
    parser.add_argument("--scale", type=float, default=0.25, help="gradient sizes x this")
    parser.add_argument("--backward-ms", type=float, default=600)
    parser.add_argument("--forward-ms", type=float, default=300)
    report.add_arguments(parser)
    parser.add_argument("--role", choices=["worker"], help=argparse.SUPPRESS)
    parser.add_argument("--order", choices=["forward", "backward"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return worker(args)
    megabytes = sum(resnet50_sizes()) * args.scale * 4 / 1e6
    print(f"ResNet-50 gradients x {args.scale:g} ({megabytes:.1f} MB fp32, 214 tensors), "
          f"2 workers, 2 server hosts, {args.mbit:g} Mbit/s links; compute "
          f"{args.backward_ms:g} ms backward + {args.forward_ms:g} ms forward; median of "
          f"{STEPS} steps")
    print(f"{'variant':>10}  {'credit':>7}  {'step s':>7}  {'gain vs FIFO':>12}")
    steps = report.Report(f"ResNet-50 step (gradients x {args.scale:g}), 2 workers, "
                          f"2 server hosts, {args.mbit:g} Mbit/s links", unit="s",
                          higher_is_better=False)
    with tempfile.TemporaryDirectory() as scratch, NetBed(hosts=4, mbit=args.mbit) as bed, \
            SshHosts(bed, scratch) as ssh:
        fifo: dict[str, float] = {}
        for label, order, credit in VARIANTS:
            seconds = run_variant(bed, ssh, args, order, credit,
                                  os.path.join(scratch, f"{label}-{credit}.json"))
            credit_text = credit if credit is not None else "default"
            if label == "FIFO":
                fifo[credit_text] = seconds
                gain = "-"
            else:
                gain = f"{fifo[credit_text] / seconds - 1:+.0%}"
            print(f"{label:>10}  {credit_text:>7}  {seconds:7.2f}  {gain:>12}", flush=True)
            steps.add(f"credit {credit_text}", label, seconds)
    report.save(args, steps)


if __name__ == "__main__":
    main()
