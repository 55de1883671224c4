"""The hierarchical local merge on against off, in one run.

    python examples/benchmarks/local_merge_benchmark.py [--mb 64] [--steps 10]

Runs a job as on 2 machines (each its own DMLC_NODE_HOST) of 2 workers each, with 2
servers, twice: with the local merge (the default) and with BYTEPS_LOCAL_MERGE=0.
Every step is one push_pull of a float32 host tensor. Prints, for both, the bytes the
servers received per step (counted by the servers) and the median step time.

All processes share this machine, so the step times show the cost of merging, not
its gain: that comes where the network between machines is the bottleneck, and the
servers receive half the bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import jobs

HOSTS, LOCAL_SIZE, SERVERS = 2, 2, 2
WARMUP = 3


def worker(out_path: str, nbytes: int, steps: int) -> None:
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    tensor = tf.ones([nbytes // 4], tf.float32)
    samples = []
    for _ in range(WARMUP + steps):
        start = time.perf_counter()
        bps.push_pull(tensor, name="gradient").numpy()
        samples.append(time.perf_counter() - start)
    if bps.rank() == 0:
        with open(out_path, "w") as out:
            json.dump({"step_s": statistics.median(samples[WARMUP:])}, out)
    bps.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="MB per worker's tensor")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    nbytes = args.mb * 2**20
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.worker:
        return worker(args.out, nbytes, args.steps)

    figures = {}
    with tempfile.TemporaryDirectory() as scratch:
        for label, merge in (("merged", "1"), ("flat", "0")):
            path = os.path.join(scratch, f"{label}.json")
            command = [sys.executable, __file__, "--worker", "--out", path, "--mb", str(args.mb),
                       "--steps", str(args.steps)]
            log: list[str] = []
            result = jobs.run_tf_bps_hosts(
                command, path, HOSTS, LOCAL_SIZE, SERVERS, output=log,
                env={"BYTEPS_LOCAL_MERGE": merge, "BYTEPS_LOG_LEVEL": "DEBUG"})
            received = jobs.server_traffic(log[0])["gradient"][0]
            figures[label] = (received / (WARMUP + args.steps), result["step_s"])
    print(f"{HOSTS} machines x {LOCAL_SIZE} workers, {SERVERS} servers, {args.mb} MB float32 "
          "push_pull per step; local merge on and off")
    print(f"{'':>7}  {'MB into servers per step':>24}  {'median step ms':>14}")
    for label, (received, step_s) in figures.items():
        print(f"{label:>7}  {received / 2**20:24.1f}  {step_s * 1e3:14.1f}")
    (merged_bytes, merged_s), (flat_bytes, flat_s) = figures["merged"], figures["flat"]
    print(f"merged / flat: bytes {merged_bytes / flat_bytes:.2f}, "
          f"step time {merged_s / flat_s:.2f}")


if __name__ == "__main__":
    main()
