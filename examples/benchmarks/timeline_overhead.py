"""What the timeline (BYTEPS_TRACE_ON) costs while it records.

    python examples/benchmarks/timeline_overhead.py [--workers 2] [--scale 0.25]
        [--json PATH] [--plot PATH]

Each step push_pulls ResNet-50's 214 gradients (sizes from Keras, times --scale) in one
tf.function, as DistributedOptimizer does. The same job runs twice on this machine,
without the timeline and with it tracing steps 10 to 20; the script prints the median
step time over those steps for both, and the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
FIRST, LAST, STEPS = 10, 20, 24


def worker(args) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    sizes = [max(1, int(np.prod(v.shape) * args.scale))
             for v in keras.applications.ResNet50(weights=None).trainable_variables]
    grads = [tf.ones([n]) for n in sizes]
    names = [f"grad{i:03d}" for i in range(len(sizes))]

    @tf.function
    def step(tensors):
        return [bps.push_pull(t, name=n, op=bps.Sum) for t, n in zip(tensors, names, strict=True)]

    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        step(grads)[0].numpy()
        times.append(time.perf_counter() - start)
    if bps.rank() == 0:
        # Step n is the n-th push_pull of each tensor (1-based).
        Path(args.out).write_text(json.dumps(statistics.median(times[FIRST - 1:LAST])))
    bps.shutdown()


def run(args, traced: bool, scratch: str) -> float:
    out = os.path.join(scratch, f"traced-{traced}.json")
    env = {**os.environ, "BYTEPS_TRACE_ON": str(int(traced)),
           "BYTEPS_TRACE_START_STEP": str(FIRST), "BYTEPS_TRACE_END_STEP": str(LAST),
           "BYTEPS_TRACE_DIR": os.path.join(scratch, "traces")}
    subprocess.run([sys.executable, "-m", "tf_bps.launch", "-np", str(args.workers),
                    sys.executable, __file__, "--role", "worker", "--out", out,
                    "--scale", str(args.scale)], env=env, check=True, timeout=900,
                   stdout=subprocess.DEVNULL)
    return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scale", type=float, default=0.25, help="gradient sizes x this")
    report.add_arguments(parser)
    parser.add_argument("--role", choices=["worker"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return worker(args)
    with tempfile.TemporaryDirectory() as scratch:
        plain = run(args, False, scratch)
        traced = run(args, True, scratch)
        events = len(json.loads(Path(scratch, "traces", "0", "comm.json").read_text())[
            "traceEvents"])
    print(f"{args.workers} workers on this machine, ResNet-50 gradients x {args.scale:g}, "
          f"median step over steps {FIRST}-{LAST}")
    print(f"without timeline {plain * 1e3:8.1f} ms")
    print(f"with timeline    {traced * 1e3:8.1f} ms   ({traced / plain - 1:+.1%}; {events} events "
          "in rank 0's file)")
    # In ms, as printed: a step on one machine takes milliseconds.
    steps = report.Report(f"push_pull step, median over steps {FIRST}-{LAST}, "
                          f"{args.workers} workers on one machine", unit="ms",
                          higher_is_better=False)
    case = f"ResNet-50 x {args.scale:g}"
    steps.add(case, "timeline off", plain * 1e3)
    steps.add(case, "timeline on", traced * 1e3)
    report.save(args, steps)


if __name__ == "__main__":
    main()
