"""push_pull against TensorFlow's MultiWorkerMirroredStrategy all-reduce, in one run.

    python examples/benchmarks/push_pull_benchmark.py [--encrypt] [--json PATH] [--plot PATH]

Runs 2 tf_bps workers with 2 servers on this machine twice, with the default same-host
transport (Unix sockets) and with TCP over loopback (BYTEPS_ENABLE_IPC=0), then 2
MultiWorkerMirroredStrategy workers (RING all-reduce, gRPC over loopback) on the same
float32 tensor sizes. Prints the algorithm bandwidth (tensor bytes / median time per
operation) of each, the ratios tf_bps / peer, and the p50 latency of the smallest size.
With --encrypt, both tf_bps jobs run again with BYTEPS_ENCRYPT=1 and a second table
gives what sealing every frame costs on each transport.
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
import report

SIZES = {"4 KB": 4 * 1024, "1 MB": 2**20, "16 MB": 16 * 2**20, "64 MB": 64 * 2**20}
NUM_WORKERS = 2


def iterations(nbytes: int) -> int:
    """Enough repetitions for a stable figure without a long run on 2 cores."""
    return max(12, min(300, int(4e8 // max(nbytes, 1))))


def time_operation(run_once, nbytes: int) -> dict:
    for _ in range(3):
        run_once()
    samples = []
    for _ in range(iterations(nbytes)):
        start = time.perf_counter()
        run_once()
        samples.append(time.perf_counter() - start)
    # The median keeps one slow sample (the other core busy elsewhere) from deciding.
    median = statistics.median(samples)
    return {"bandwidth_gbs": nbytes / median / 1e9, "p50_us": median * 1e6}


def tf_bps_worker(out_path: str) -> None:
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    results = {}
    for label, nbytes in SIZES.items():
        tensor = tf.ones([nbytes // 4], tf.float32)
        name = f"bench/{label}"
        results[label] = time_operation(lambda t=tensor, n=name: bps.push_pull(t, name=n).numpy(),
                                        nbytes)
    if bps.rank() == 0:
        with open(out_path, "w") as out:
            json.dump(results, out)
    bps.shutdown()


def mwms_worker(out_path: str) -> None:
    import tensorflow as tf

    all_reduce = jobs.mwms_all_reduce()
    results = {}
    for label, nbytes in SIZES.items():
        tensor = tf.ones([nbytes // 4], tf.float32)
        results[label] = time_operation(lambda t=tensor: all_reduce(t).numpy(), nbytes)
    if jobs.is_mwms_chief():
        with open(out_path, "w") as out:
            json.dump(results, out)


def worker_command(role: str, out_path: str) -> list[str]:
    return [sys.executable, __file__, "--role", role, "--out", out_path]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["tf_bps", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--encrypt", action="store_true",
                        help="also run the tf_bps jobs with BYTEPS_ENCRYPT=1")
    report.add_arguments(parser)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.role == "tf_bps":
        return tf_bps_worker(args.out)
    if args.role == "mwms":
        return mwms_worker(args.out)

    with tempfile.TemporaryDirectory() as scratch:
        def tf_bps_job(name: str, ipc: str, encrypt: str = "0") -> dict:
            path = os.path.join(scratch, f"{name}.json")
            return jobs.run_tf_bps(worker_command("tf_bps", path), path, NUM_WORKERS,
                                   num_servers=2,
                                   env={"BYTEPS_ENABLE_IPC": ipc, "BYTEPS_ENCRYPT": encrypt})

        local = tf_bps_job("local", "1")
        tcp = tf_bps_job("tcp", "0")
        if args.encrypt:
            sealed = {"local": tf_bps_job("local-sealed", "1", "1"),
                      "tcp": tf_bps_job("tcp-sealed", "0", "1")}
        path = os.path.join(scratch, "mwms.json")
        peer = jobs.run_mwms(worker_command("mwms", path), path, NUM_WORKERS)
    print(f"{NUM_WORKERS} workers, float32, algorithm bandwidth in GB/s; tf_bps with 2 servers "
          "(Unix sockets, and TCP loopback), MultiWorkerMirroredStrategy RING")
    print(f"{'size':>6}  {'tf_bps':>8}  {'tf_bps TCP':>10}  {'MWMS':>8}  {'ratio':>6}  "
          f"{'TCP ratio':>9}")
    for label in SIZES:
        a, t, b = (r[label]["bandwidth_gbs"] for r in (local, tcp, peer))
        print(f"{label:>6}  {a:8.3f}  {t:10.3f}  {b:8.3f}  {a / b:5.2f}x  {t / b:8.2f}x")
    small = next(iter(SIZES))
    a, t, b = (r[small]["p50_us"] for r in (local, tcp, peer))
    print(f"p50 latency at {small}: tf_bps {a:.0f} us, tf_bps TCP {t:.0f} us, MWMS {b:.0f} us "
          f"(tf_bps / MWMS = {a / b:.2f}, TCP / MWMS = {t / b:.2f})")
    if args.encrypt:
        print_sealing_cost({"local": local, "tcp": tcp}, sealed)
    runs = {"tf_bps": local, "tf_bps TCP": tcp, "MultiWorkerMirroredStrategy": peer}
    if args.encrypt:  # the sealed jobs are series of their own; their costs stay in the table
        runs |= {"tf_bps sealed": sealed["local"], "tf_bps TCP sealed": sealed["tcp"]}
    report.save(args, *figures(runs))


def figures(runs: dict[str, dict]) -> list[report.Report]:
    """The tables' figures by series: bandwidth at every size, p50 latency at the smallest."""
    job = f"{NUM_WORKERS} workers, float32 (tf_bps: 2 servers; peer: RING all-reduce)"
    bandwidth = report.Report(f"push_pull algorithm bandwidth, {job}", unit="GB/s",
                              higher_is_better=True)
    latency = report.Report(f"push_pull p50 latency, {job}", unit="us", higher_is_better=False)
    small = next(iter(SIZES))
    for series, results in runs.items():
        for label in SIZES:
            bandwidth.add(label, series, results[label]["bandwidth_gbs"])
        latency.add(small, series, results[small]["p50_us"])
    return [bandwidth, latency]


def print_sealing_cost(clear: dict, sealed: dict) -> None:
    """Bandwidth with and without BYTEPS_ENCRYPT, and what sealing costs (1 - sealed /
    clear); for the smallest size, the p50 latency instead."""
    print("\nBYTEPS_ENCRYPT=1 (AES-256-GCM on every frame), GB/s: clear, sealed, cost")
    print(f"{'size':>6}  {'Unix':>7}  {'sealed':>7}  {'cost':>6}  {'TCP':>7}  {'sealed':>7}  "
          f"{'cost':>6}")
    for label in SIZES:
        row = f"{label:>6}"
        for transport in ("local", "tcp"):
            a = clear[transport][label]["bandwidth_gbs"]
            b = sealed[transport][label]["bandwidth_gbs"]
            row += f"  {a:7.3f}  {b:7.3f}  {1 - b / a:6.1%}"
        print(row)
    small = next(iter(SIZES))
    print(f"p50 latency at {small}, clear / sealed: Unix "
          f"{clear['local'][small]['p50_us']:.0f} / {sealed['local'][small]['p50_us']:.0f} us, "
          f"TCP {clear['tcp'][small]['p50_us']:.0f} / {sealed['tcp'][small]['p50_us']:.0f} us")


if __name__ == "__main__":
    main()
