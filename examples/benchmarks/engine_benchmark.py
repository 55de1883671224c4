"""The same 4-worker Keras job started three ways on this machine: by bpslaunch, by
tf_bps.ray.RayExecutor on a local Ray cluster, and by tf_bps.spark.run on Spark's
local-cluster mode. Prints, for each, the start-up time to the first step and the
steady steps per second, and each engine's overhead on the steady step next to
bpslaunch's, measured in the same run.

    python examples/benchmarks/engine_benchmark.py [--steps 120] [--rounds 3]
        [--engines bpslaunch,ray,spark]

Start-up runs from the moment the engine is asked for the job (bpslaunch's process
started; RayExecutor.start() called; spark.run() called, with the SparkSession and the
Ray cluster already up, as they are for their users) to the end of the first training
step on the slowest rank. The steady step is the median time between the ends of
steps 10.. on rank 0. Each job trains the same MLP (about 1.1 M parameters) through
DistributedOptimizer under model.fit, batch 64 per worker, with one server (the engines
start one per node or executor machine, and all of them are this one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

NUM_WORKERS = 4
WARMUP_STEPS = 10


def workload(steps: int) -> dict:
    """One rank's training; returns when its steps ended (wall clock, this machine)."""
    import keras
    import numpy as np

    import tf_bps as bps

    bps.init()
    rng = np.random.default_rng(bps.rank())
    x = rng.normal(size=(64 * steps, 512)).astype("float32")
    y = rng.normal(size=(64 * steps, 10)).astype("float32")
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.001)), loss="mse")
    ends = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.time())

    model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[Clock()])
    return {"rank": bps.rank(), "ends": ends}


def summary(started: float, ranks: list[dict]) -> dict:
    first = max(rank["ends"][0] for rank in ranks) - started
    ends = next(rank for rank in ranks if rank["rank"] == 0)["ends"]
    step = statistics.median(b - a for a, b in itertools.pairwise(ends[WARMUP_STEPS:]))
    return {"start_to_first_step_s": round(first, 2), "steady_step_ms": round(step * 1e3, 2),
            "steps_per_s": round(1 / step, 2)}


def with_bpslaunch(steps: int) -> dict:
    started = time.time()
    # One server, as the engines start on one machine (one per node or executor host).
    done = subprocess.run([sys.executable, "-m", "tf_bps.launch", "-np", str(NUM_WORKERS),
                           "--num-servers", "1", sys.executable, __file__, "--worker",
                           "--steps", str(steps)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bpslaunch failed:\n{done.stdout}{done.stderr}")
    ranks = [json.loads(line.split("RANK ", 1)[1]) for line in done.stdout.splitlines()
             if "RANK " in line]
    return summary(started, ranks)


def with_ray(steps: int) -> dict:
    # Ray otherwise advertises this machine's other address for 127.0.0.1 (see
    # tests/test_ray.py); must be set before Ray is imported.
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
                      RAY_TMPDIR=tempfile.mkdtemp(prefix="tfbps-ray-"))
    import ray

    from tf_bps.ray import RayExecutor

    ray.init(num_cpus=NUM_WORKERS, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=100 * 2**20, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        started = time.time()
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=120),
                               num_workers=NUM_WORKERS)
        executor.start()
        try:
            return summary(started, executor.run(workload, args=(steps,)))
        finally:
            executor.shutdown()
    finally:
        ray.shutdown()


def with_spark(steps: int) -> dict:
    from pyspark.sql import SparkSession

    import tf_bps.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' Python: the one with tf_bps

    spark = (SparkSession.builder.master(f"local-cluster[2,{NUM_WORKERS // 2},2048]")
             .config("spark.ui.enabled", "false")
             .appName("engine_benchmark").getOrCreate())
    try:
        spark.sparkContext.parallelize(range(NUM_WORKERS), NUM_WORKERS).count()  # executors up
        started = time.time()
        ranks = tf_bps.spark.run(workload, args=(steps,), num_proc=NUM_WORKERS, verbose=0)
        return summary(started, ranks)
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--engines", default="bpslaunch,ray,spark")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RANK " + json.dumps(workload(args.steps)), flush=True)
        return
    runners = {"bpslaunch": with_bpslaunch, "ray": with_ray, "spark": with_spark}
    names = args.engines.split(",")
    # Rounds of every engine in turn: each figure is the median over the rounds, so that
    # a slower moment of the machine does not land on one engine alone.
    rounds = [{name: runners[name](args.steps) for name in names} for _ in range(args.rounds)]
    results = {name: {figure: round(statistics.median(r[name][figure] for r in rounds), 2)
                      for figure in rounds[0][name]} for name in names}
    base = results.get("bpslaunch")
    print(f"{NUM_WORKERS} workers, {args.steps} steps each, median of {args.rounds} round(s)")
    print(f"{'engine':<10} {'start to 1st step s':>20} {'steady step ms':>15} {'steps/s':>8} "
          f"{'steady overhead':>16}")
    for name, figures in results.items():
        overhead = (f"{figures['steady_step_ms'] / base['steady_step_ms'] - 1:+.1%}"
                    if base else "-")
        print(f"{name:<10} {figures['start_to_first_step_s']:>20} "
              f"{figures['steady_step_ms']:>15} {figures['steps_per_s']:>8} {overhead:>16}")


if __name__ == "__main__":
    main()
