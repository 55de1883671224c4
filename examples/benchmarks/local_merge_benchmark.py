"""The hierarchical local merge on against off, in one run.

    python examples/benchmarks/local_merge_benchmark.py [--mb 64] [--steps 10] [--mbit B]
        [--json PATH] [--plot PATH]

Runs a job of 2 machines with 2 workers each, and 2 servers, twice: with the local
merge (the default) and with BYTEPS_LOCAL_MERGE=0. Every step is one push_pull of a
float32 host tensor. Prints, for both, the bytes the servers received per step
(counted by the servers) and the median step time.

By default the machines are emulated on this one (each its own DMLC_NODE_HOST), so the
step times show the cost of merging, not its gain. With --mbit (as root) they are
network namespaces with links of B Mbit/s (tests/netbed.py), the servers on hosts of
their own: the regime where the network is the bottleneck and the merge should halve
the step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import jobs
import report

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from netbed import NetBed  # noqa: E402  (the test bed lives with the tests)

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
    parser.add_argument("--mbit", type=float, help="namespace hosts with links of this rate")
    report.add_arguments(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    nbytes = args.mb * 2**20
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.worker:
        return worker(args.out, nbytes, args.steps)

    figures = {}
    hosts = NetBed(HOSTS + SERVERS, args.mbit) if args.mbit else nullcontext()
    with tempfile.TemporaryDirectory() as scratch, hosts as bed:
        for label, merge in (("merged", "1"), ("flat", "0")):
            path = os.path.join(scratch, f"{label}.json")
            command = [sys.executable, __file__, "--worker", "--out", path, "--mb", str(args.mb),
                       "--steps", str(args.steps)]
            log: list[str] = []
            result = jobs.run_tf_bps_hosts(
                command, path, HOSTS, LOCAL_SIZE, SERVERS, output=log, bed=bed,
                env={"BYTEPS_LOCAL_MERGE": merge, "BYTEPS_LOG_LEVEL": "DEBUG"})
            received = jobs.server_traffic(log[0])["gradient"][0]
            figures[label] = (received / (WARMUP + args.steps), result["step_s"])
    where = f"namespaces, {args.mbit:g} Mbit/s links" if args.mbit else "emulated on this one"
    print(f"{HOSTS} machines x {LOCAL_SIZE} workers ({where}), {SERVERS} servers, {args.mb} MB "
          "float32 push_pull per step; local merge on and off")
    print(f"{'':>7}  {'MB into servers per step':>24}  {'median step ms':>14}")
    place = f"{args.mbit:g} Mbit/s links" if args.mbit else "emulated"  # short, for plot titles
    job = f"{HOSTS} machines x {LOCAL_SIZE} workers ({place}), {SERVERS} servers"
    received_mb = report.Report(f"data into the servers per step, {job}", unit="MB",
                                higher_is_better=False)
    step_ms = report.Report(f"median push_pull step time, {job}", unit="ms",
                            higher_is_better=False)
    # The table's rows, merged and flat, are the two series: the merge against its absence.
    case = f"{args.mb} MB"
    for label, (received, step_s) in figures.items():
        print(f"{label:>7}  {received / 2**20:24.1f}  {step_s * 1e3:14.1f}")
        received_mb.add(case, label, received / 2**20)
        step_ms.add(case, label, step_s * 1e3)
    (merged_bytes, merged_s), (flat_bytes, flat_s) = figures["merged"], figures["flat"]
    print(f"merged / flat: bytes {merged_bytes / flat_bytes:.2f}, "
          f"step time {merged_s / flat_s:.2f}")
    report.save(args, received_mb, step_ms)


if __name__ == "__main__":
    main()
