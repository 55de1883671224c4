"""Runs a tf_bps job inside a Spark application, as `horovod.spark.run` does.

    import tf_bps.spark

    def train(epochs):
        import tf_bps as bps
        bps.init()
        ...
        return bps.rank()

    results = tf_bps.spark.run(train, args=(3,), num_proc=4)   # [0, 1, 2, 3]

`run_elastic` runs an elastic job instead (elastic.py).

Each rank is one task of a barrier stage (`sc.parallelize(range(n), n).barrier()`),
and its partition id is its rank. The scheduler runs in the driver, one server on each
executor machine, and each rank's function in a process its task starts with the job's
variables set (driver.py, task.py, worker.py). Spark places the processes; tf_bps's own
scheduler, servers and rounds move the tensors.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from tf_bps.spark.driver import JobDriver, TaskPlan
from tf_bps.spark.elastic import run_elastic
from tf_bps.spark.task import barrier_task

__all__ = ["run", "run_elastic", "SparkJobError"]


class SparkJobError(RuntimeError):
    """A rank failed, or the Spark job did: the message names the rank and why."""


def run(fn: Callable, args: tuple = (), kwargs: Mapping[str, Any] | None = None,
        num_proc: int | None = None, start_timeout: float | None = None,
        env: Mapping[str, str] | None = None, stdout: TextIO | None = None,
        stderr: TextIO | None = None, verbose: int = 1,
        prefix_output_with_timestamp: bool = False) -> list:
    """Runs `fn(*args, **kwargs)` on `num_proc` ranks in Spark tasks; returns their
    results in rank order.

    Args:
        fn: what each rank runs; it calls `bps.init()` itself. It and its arguments
            travel to the executors with cloudpickle, its result back with pickle.
        num_proc: ranks (default: the SparkContext's defaultParallelism). The cluster
            needs this many free task slots at once (a barrier stage).
        start_timeout: seconds for every rank to start and the job to form (default:
            HOROVOD_SPARK_START_TIMEOUT, else 600).
        env: variables set for every rank, server and the scheduler, on top of the
            executor's environment (BYTEPS_*, say).
        stdout, stderr: where each rank's output lines go on the driver, each as
            `[rank]<stdout>:line`; None leaves them in the executors' logs.
        verbose: 0 silent; 1 (default) the driver says what it starts and why it
            cancels; 2 also has tf_bps log at INFO and forwards TensorFlow's start-up
            notices, which are dropped otherwise.
        prefix_output_with_timestamp: each forwarded line starts with the time.

    Raises:
        SparkJobError: a rank failed (the earliest failure is named), the ranks did not
            start in time, or Spark failed the job (an executor was lost).
    """
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        raise SparkJobError("no active SparkContext: start one (SparkSession.builder..."
                            "getOrCreate()) before tf_bps.spark.run")
    num_proc = num_proc or context.defaultParallelism
    if start_timeout is None:
        start_timeout = float(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", "600"))
    job_env = {str(k): str(v) for k, v in (env or {}).items()}
    if verbose >= 2:
        job_env.setdefault("BYTEPS_LOG_LEVEL", "INFO")
    driver = JobDriver(context.getConf().get("spark.driver.host") or "127.0.0.1", job_env,
                       start_timeout, verbose, stdout, stderr, prefix_output_with_timestamp)
    try:
        # TensorFlow's start-up notices: hidden unless asked for (verbose=2, or a
        # TF_CPP_MIN_LOG_LEVEL of the user's), as bpslaunch does.
        asked = verbose >= 2 or "TF_CPP_MIN_LOG_LEVEL" in job_env
        return _run_stage(context, driver, fn, args, dict(kwargs or {}), num_proc, job_env,
                          stdout is not None, stderr is not None, hide_tf_notices=not asked)
    finally:
        driver.close()


def _run_stage(context, driver: JobDriver, fn, args, kwargs, num_proc: int,
               job_env: dict[str, str], forward_stdout: bool, forward_stderr: bool,
               hide_tf_notices: bool) -> list:
    """The barrier stage, and its outcome turned into results or an error."""
    from pyspark import cloudpickle

    plan = TaskPlan(driver.address, driver.secret, cloudpickle.dumps((fn, args, kwargs)),
                    job_env, forward_stdout, forward_stderr, hide_tf_notices)
    tag = f"tf_bps-spark-{driver.secret[:12]}"
    driver.cancel_spark = lambda: context.cancelJobsWithTag(tag)
    driver.say(f"running {num_proc} process(es)")
    context.addJobTag(tag)
    driver.watch_start(num_proc)
    try:
        rdd = context.parallelize(range(num_proc), num_proc).barrier()
        outcomes = rdd.mapPartitions(barrier_task(plan)).collect()
    except Exception as error:  # py4j's error, which pyspark may wrap
        reason = driver.cancel_reason or f"Spark failed the job: {_first_line(error)}"
        failures = driver.failures()
        if failures and not driver.cancel_reason:
            _, rank, message = failures[0]
            reason += f" (before that, rank {rank} failed: {message})"
        raise SparkJobError(f"tf_bps.spark.run failed: {reason}") from None
    finally:
        context.removeJobTag(tag)
    failed = sorted((rank, payload) for rank, kind, payload in outcomes if kind != "ok")
    if failed:
        raise SparkJobError(_failure_message(driver, failed))
    return [pickle.loads(payload) for _, _, payload in sorted(outcomes)]


def _failure_message(driver: JobDriver, failed: list[tuple[int, str]]) -> str:
    """Names the rank that failed first (the others often fail because it did)."""
    errors = dict(failed)
    order = [rank for _, rank, _ in driver.failures() if rank in errors]
    first = order[0] if order else failed[0][0]
    message = f"rank {first} failed:\n{str(errors[first]).rstrip()}"
    others = [rank for rank in errors if rank != first]
    if others:
        message += f"\n(then rank(s) {', '.join(map(str, others))} failed too)"
    return message


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    for line in text.splitlines():
        if "Exception:" in line or "aborted" in line:
            return line.strip().lstrip(": ")
    return text.splitlines()[0] if text else type(error).__name__
