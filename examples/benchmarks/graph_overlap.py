"""Overlap of a step's push_pulls inside a tf.function, measured under a bandwidth limit.

    sudo python examples/benchmarks/graph_overlap.py [--mbit 200] [--scale 0.25]
        [--json PATH] [--plot PATH]

A tf.function step push_pulls ResNet-50's 214 gradients (sizes times --scale), all
ready at once, as `model.fit` does after the backward pass. Two variants in one run:
    parallel    what tf_bps builds: ops on different tensors run together, ranked in
                the model's order (tf_bps/runtime/ops.py)
    chained     each push_pull waits for the previous one to finish, which is what
                TensorFlow's automatic control dependencies made of every stateful op
                before tf_bps marked its ops order-insensitive
Two worker hosts and two server hosts (tests/netbed.py, every link limited to --mbit),
the job started with `bpslaunch -H` over ssh. Prints the median step time of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import jobs  # noqa: E402
import report  # noqa: E402
from netbed import NetBed, SshHosts  # noqa: E402  (the test bed lives with the tests)
from priority_benchmark import resnet50_sizes  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
WARMUP, STEPS = 2, 5


def worker(args) -> None:
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    sizes = [max(1, int(n * args.scale)) for n in resnet50_sizes()]
    names = [f"layer{i:03d}" for i in range(len(sizes))]
    grads = [tf.ones([n]) for n in sizes]

    @tf.function
    def step(tensors):
        sums, previous = [], []
        for tensor, name in zip(tensors, names, strict=True):
            with tf.control_dependencies(previous if args.variant == "chained" else []):
                total = bps.push_pull(tensor, name=name, op=bps.Sum)
            sums.append(total)
            previous = [total]
        return sums

    samples = []
    for _ in range(WARMUP + STEPS):
        start = time.perf_counter()
        sums = step(grads)
        if float(sums[0][0]) != bps.size():
            raise SystemExit(f"wrong sum {float(sums[0][0])}")
        samples.append(time.perf_counter() - start)
    if bps.rank() == 0:
        Path(args.out).write_text(json.dumps({"seconds": statistics.median(samples[WARMUP:])}))
    bps.shutdown()


def run_variant(bed: NetBed, ssh: SshHosts, args, variant: str, out: str) -> float:
    worker = [sys.executable, __file__, "--role", "worker", "--variant", variant, "--out", out,
              "--scale", str(args.scale)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return jobs.run_tf_bps_over_ssh(bed, ssh, worker, out, env)["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbit", type=float, default=200, help="link rate per host and way")
    parser.add_argument("--scale", type=float, default=0.25, help="gradient sizes x this")
    report.add_arguments(parser)
    parser.add_argument("--role", choices=["worker"], help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=["parallel", "chained"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return worker(args)
    megabytes = sum(resnet50_sizes()) * args.scale * 4 / 1e6
    print(f"ResNet-50 gradients x {args.scale:g} ({megabytes:.1f} MB fp32, 214 tensors) in "
          f"one tf.function step, 2 workers, 2 server hosts, {args.mbit:g} Mbit/s links; "
          f"median of {STEPS} steps")
    with tempfile.TemporaryDirectory() as scratch, NetBed(hosts=4, mbit=args.mbit) as bed, \
            SshHosts(bed, scratch) as ssh:
        seconds = {variant: run_variant(bed, ssh, args, variant,
                                        os.path.join(scratch, f"{variant}.json"))
                   for variant in ("chained", "parallel")}
    for variant, value in seconds.items():
        print(f"{variant:>9}: {value:6.2f} s per step")
    print(f"parallel: {seconds['chained'] / seconds['parallel']:.2f}x faster than chained")
    steps = report.Report("ResNet-50's push_pulls in one tf.function step, 2 workers, "
                          f"2 server hosts, {args.mbit:g} Mbit/s links", unit="s",
                          higher_is_better=False)
    case = f"ResNet-50 x {args.scale:g}"
    for variant, value in seconds.items():
        steps.add(case, variant, value)
    report.save(args, steps)


if __name__ == "__main__":
    main()
