"""broadcast and allgather: tf_bps's native operations against the zero-padded sums that
emulated them before, and against MultiWorkerMirroredStrategy, in one run.

    python examples/benchmarks/collectives_benchmark.py [--mb 64] [--json PATH] [--plot PATH]

Runs 2 tf_bps workers with 2 servers on this machine (default same-host transport),
then 2 MultiWorkerMirroredStrategy workers (RING, gRPC over loopback). Each worker's
tensor is --mb MB of float32. Broadcast: rank 0's tensor to every worker; allgather:
every worker's tensor concatenated (the result is 2 x --mb MB). Prints the median time
per operation of each and the ratios, plus the bytes each worker must send and receive
at least (the data that has to move) next to what the emulation moved.
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

NUM_WORKERS = 2
REPEATS = 20


def median_seconds(run_once) -> float:
    for _ in range(3):
        run_once()
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run_once()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def last_element(result) -> float:
    """Waits for the result without timing a copy of it: `.numpy()` of a 128 MB tensor
    copies it, which would add the same ~20 ms to every figure."""
    return float(result[-1].numpy())


def tf_bps_worker(out_path: str, nbytes: int) -> None:
    import tensorflow as tf

    import tf_bps as bps

    bps.init()
    rank, size = bps.rank(), bps.size()
    tensor = tf.fill([nbytes // 4], float(rank + 1))

    def emulated_broadcast():
        # The root's value in a sum where every other worker contributes zeros.
        contribution = tensor if rank == 0 else tf.zeros_like(tensor)
        return bps.push_pull(contribution, op=bps.Sum, name="emulated_broadcast")

    def emulated_allgather():
        # Row counts by a sum of one-hot vectors, then each worker's rows in a zero
        # tensor of the whole result's size, summed.
        rows = tf.shape(tensor, out_type=tf.int64)[0]
        counts = bps.push_pull(tf.one_hot(rank, size, dtype=tf.int64) * rows, op=bps.Sum,
                               name="emulated_allgather.rows")
        before = tf.reduce_sum(counts[:rank])
        after = tf.reduce_sum(counts) - before - rows
        return bps.push_pull(tf.pad(tensor, [[before, after]]), op=bps.Sum,
                             name="emulated_allgather")

    expected_gather = tf.concat([tf.fill([nbytes // 4], float(r + 1)) for r in range(size)], 0)
    checks = {
        "broadcast": (lambda: bps.broadcast(tensor, 0, name="broadcast"), tf.ones_like(tensor)),
        "emulated broadcast": (emulated_broadcast, tf.ones_like(tensor)),
        "allgather": (lambda: bps.allgather(tensor, name="allgather"), expected_gather),
        "emulated allgather": (emulated_allgather, expected_gather),
    }
    results = {}
    for label, (operation, expected) in checks.items():
        # A benchmark of a wrong result is worthless: check before timing.
        tf.debugging.assert_equal(operation(), expected, message=label)
        results[label] = median_seconds(lambda op=operation: last_element(op()))
    if rank == 0:
        with open(out_path, "w") as out:
            json.dump(results, out)
    bps.shutdown()


def mwms_worker(out_path: str, nbytes: int) -> None:
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    rank = strategy.cluster_resolver.task_id
    tensor = tf.fill([nbytes // 4], float(rank + 1))

    @tf.function
    def broadcast(t):
        def replica_fn(value):
            # MWMS has no cross-worker broadcast for tensors: a sum with zeros is its way.
            mine = tf.identity(value) if rank == 0 else tf.zeros_like(value)
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                                  mine)
        return strategy.run(replica_fn, args=(t,))

    @tf.function
    def allgather(t):
        def replica_fn(value):
            return tf.distribute.get_replica_context().all_gather(tf.identity(value), axis=0)
        return strategy.run(replica_fn, args=(t,))

    results = {}
    for label, fn in (("broadcast", broadcast), ("allgather", allgather)):
        results[label] = median_seconds(
            lambda f=fn: last_element(strategy.experimental_local_results(f(tensor))[0]))
    if jobs.is_mwms_chief():
        with open(out_path, "w") as out:
            json.dump(results, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="MB per worker's tensor")
    report.add_arguments(parser)
    parser.add_argument("--role", choices=["tf_bps", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    nbytes = args.mb * 2**20
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.role == "tf_bps":
        return tf_bps_worker(args.out, nbytes)
    if args.role == "mwms":
        return mwms_worker(args.out, nbytes)

    def command(role, path):
        return [sys.executable, __file__, "--role", role, "--out", path, "--mb", str(args.mb)]

    with tempfile.TemporaryDirectory() as scratch:
        ours_path, peer_path = (os.path.join(scratch, f"{n}.json") for n in ("ours", "mwms"))
        # Servers log each tensor's traffic at DEBUG when they stop.
        log: list[str] = []
        ours = jobs.run_tf_bps(command("tf_bps", ours_path), ours_path, NUM_WORKERS,
                               num_servers=2, env={"BYTEPS_LOG_LEVEL": "DEBUG"}, output=log)
        peer = jobs.run_mwms(command("mwms", peer_path), peer_path, NUM_WORKERS)
    mb = args.mb
    print(f"{NUM_WORKERS} workers, {mb} MB float32 per worker; median ms per operation "
          "(tf_bps: 2 servers, shared memory; MWMS: RING over gRPC)")
    print(f"{'operation':>10}  {'tf_bps':>8}  {'emulated':>9}  {'MWMS':>8}  "
          f"{'vs emulated':>11}  {'vs MWMS':>8}")
    job = f"{NUM_WORKERS} workers, {mb} MB float32 each"
    times = report.Report(f"median time per operation, {job}", unit="ms", higher_is_better=False)
    for op in ("broadcast", "allgather"):
        native, emulated, mwms = ours[op], ours[f"emulated {op}"], peer[op]
        print(f"{op:>10}  {native * 1e3:8.1f}  {emulated * 1e3:9.1f}  {mwms * 1e3:8.1f}  "
              f"{emulated / native:10.2f}x  {mwms / native:7.2f}x")
        times.add(op, "tf_bps", native * 1e3)
        times.add(op, "tf_bps emulated", emulated * 1e3)
        times.add(op, "MultiWorkerMirroredStrategy", mwms * 1e3)
    # What must cross between a worker and the servers, per worker and operation:
    # broadcast: the root sends its tensor once, every other worker receives it once;
    # allgather: each sends its rows once and receives all rows once.
    n = NUM_WORKERS
    moved = {name: sum(traffic) for name, traffic in jobs.server_traffic(log[0]).items()}
    calls = 4 + REPEATS  # the check, 3 warm-up runs and the timed ones
    print("MB between a worker and the servers per operation, sent + received (measured at "
          "the servers, averaged over workers; must move: broadcast "
          f"{mb}, allgather {mb + n * mb}):")
    # Measured figures only: what must move is a floor worked out here, not measured.
    volume = report.Report(f"worker-server traffic per operation, sent + received, {job}",
                           unit="MB", higher_is_better=False)
    for op in ("broadcast", "allgather"):
        native = moved.get(op, 0) / calls / n / 2**20
        names = (f"emulated_{op}", f"emulated_{op}.rows")
        emulated = sum(moved.get(name, 0) for name in names) / calls / n / 2**20
        print(f"{op:>10}  {native:8.1f}  emulated {emulated:8.1f}")
        volume.add(op, "tf_bps", native)
        volume.add(op, "tf_bps emulated", emulated)
    report.save(args, times, volume)


if __name__ == "__main__":
    main()
