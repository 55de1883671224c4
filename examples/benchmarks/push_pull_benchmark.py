"""push_pull against TensorFlow's MultiWorkerMirroredStrategy all-reduce, in one run.

    python examples/benchmarks/push_pull_benchmark.py

Runs 2 tf_bps workers with 2 servers on this machine twice, with the default same-host
transport (Unix sockets) and with TCP over loopback (BYTEPS_ENABLE_IPC=0), then 2
MultiWorkerMirroredStrategy workers (RING all-reduce, gRPC over loopback) on the same
float32 tensor sizes. Prints the algorithm bandwidth (tensor bytes / median time per
operation) of each, the ratios tf_bps / peer, and the p50 latency of the smallest size.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

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

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    results = {}
    for label, nbytes in SIZES.items():
        tensor = tf.ones([nbytes // 4], tf.float32)

        @tf.function
        def all_reduce(t):
            def replica_fn(value):
                context = tf.distribute.get_replica_context()
                # A tensor placed on the replica device: all_reduce needs a destination.
                return context.all_reduce(tf.distribute.ReduceOp.MEAN, tf.identity(value))

            return strategy.run(replica_fn, args=(t,))

        results[label] = time_operation(
            lambda t=tensor, f=all_reduce: strategy.experimental_local_results(f(t))[0].numpy(),
            nbytes)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if task == 0:
        with open(out_path, "w") as out:
            json.dump(results, out)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_tf_bps(out_path: str, ipc: bool) -> dict:
    env = {**os.environ, "BYTEPS_ENABLE_IPC": "1" if ipc else "0"}
    command = [sys.executable, "-m", "tf_bps.launcher", "-np", str(NUM_WORKERS),
               "--num-servers", "2", sys.executable, __file__, "--role", "tf_bps",
               "--out", out_path]
    done = subprocess.run(command, timeout=900, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the tf_bps job failed:\n{done.stdout}{done.stderr}")
    with open(out_path) as results:
        return json.load(results)


def run_mwms(out_path: str) -> dict:
    ports = [free_port() for _ in range(NUM_WORKERS)]
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    for index in range(NUM_WORKERS):
        env = {**os.environ, "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})}
        processes.append(subprocess.Popen(
            [sys.executable, __file__, "--role", "mwms", "--out", out_path], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    try:
        for process in processes:
            _, errors = process.communicate(timeout=900)
            if process.returncode != 0:
                raise RuntimeError(f"a MultiWorkerMirroredStrategy worker failed:\n{errors}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    with open(out_path) as results:
        return json.load(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["tf_bps", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.role == "tf_bps":
        return tf_bps_worker(args.out)
    if args.role == "mwms":
        return mwms_worker(args.out)

    with tempfile.TemporaryDirectory() as scratch:
        local = run_tf_bps(os.path.join(scratch, "local.json"), ipc=True)
        tcp = run_tf_bps(os.path.join(scratch, "tcp.json"), ipc=False)
        peer = run_mwms(os.path.join(scratch, "mwms.json"))
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


if __name__ == "__main__":
    main()
