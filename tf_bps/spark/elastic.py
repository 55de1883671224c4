"""`tf_bps.spark.run_elastic`: an elastic job (README, "Elastic training") whose workers
are Spark tasks, as `horovod.spark.run_elastic` runs one.

An elastic job must outlive any one executor, so it runs differently from `run`:

- The scheduler and one server run in the driver for the whole run (as bpslaunch's
  discovery mode runs them on the launching machine), not on executors that may go.
- The ranks are ordinary tasks, not a barrier stage: when an executor is lost, Spark
  runs its tasks again elsewhere (up to spark.task.maxFailures), and each new attempt
  joins the job as a newcomer. The survivors re-form without the lost rank first, and
  take the newcomer in at their next commit; `fn` trains inside `tf_bps.elastic.run`.
- A rank whose function raises is a result, not a Spark failure: the job goes on without
  it, and run_elastic fails only when no rank succeeded (as bpslaunch's elastic jobs).
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from tf_bps.spark.driver import JobDriver, TaskPlan
from tf_bps.spark.task import run_rank


def elastic_task(plan: TaskPlan, num_proc: int):
    """The function mapPartitions runs in every task of an elastic job."""
    def task(_rows):
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt = context.partitionId(), context.attemptNumber()
        host = os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()
        # The first generation numbers workers by DMLC_WORKER_ID; a later attempt joins
        # and is numbered by its arrival (elastic_driver.py does the same).
        variables = {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(partition),
                     "DMLC_NUM_WORKER": str(num_proc), "BYTEPS_LOCAL_RANK": "0",
                     "BYTEPS_LOCAL_SIZE": "1", "DMLC_NUM_SERVER": "1",
                     "HOROVOD_HOSTNAME": host,
                     "BYTEPS_ELASTIC_WORKER_NAME": f"spark-task-{partition}.{attempt}"}
        kind, payload = run_rank(plan, partition, 0, variables)
        yield partition, attempt, kind, payload
    return task


def run_elastic(fn: Callable, args: tuple = (), kwargs: Mapping[str, Any] | None = None,
                num_proc: int | None = None, min_num_proc: int | None = None,
                max_num_proc: int | None = None, start_timeout: float | None = None,
                elastic_timeout: float | None = None, reset_limit: int | None = None,
                env: Mapping[str, str] | None = None, stdout: TextIO | None = None,
                stderr: TextIO | None = None, verbose: int = 1,
                prefix_output_with_timestamp: bool = False) -> list:
    """Runs `fn(*args, **kwargs)` as an elastic job of `num_proc` Spark tasks; returns
    the results of the tasks that succeeded, by partition.

    Args:
        num_proc: tasks, and so the most ranks at once (default: defaultParallelism).
        min_num_proc: the fewest ranks the job goes on with (default num_proc).
        max_num_proc: BYTEPS_ELASTIC_MAX_WORKERS (default num_proc); Spark runs
            num_proc tasks, so the job is never larger than that.
        elastic_timeout, reset_limit: BYTEPS_ELASTIC_TIMEOUT and
            BYTEPS_ELASTIC_RESET_LIMIT (defaults 600 s and none).
        The others are run's.

    Raises:
        SparkJobError: no rank succeeded (the earliest failure is named), the ranks did
            not start in time, or Spark failed the job (a task lost too often).
    """
    from pyspark import SparkContext, cloudpickle

    from tf_bps.spark import SparkJobError, _first_line

    context = SparkContext._active_spark_context
    if context is None:
        raise SparkJobError("no active SparkContext: start one before run_elastic")
    num_proc = num_proc or context.defaultParallelism
    low, high = min_num_proc or num_proc, max_num_proc or num_proc
    if not 1 <= low <= num_proc <= high:
        raise ValueError(f"run_elastic needs 1 <= min_num_proc ({low}) <= num_proc "
                         f"({num_proc}) <= max_num_proc ({high})")
    if start_timeout is None:
        start_timeout = float(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", "600"))
    job_env = {str(k): str(v) for k, v in (env or {}).items()}
    if verbose >= 2:
        job_env.setdefault("BYTEPS_LOG_LEVEL", "INFO")
    elastic = {"BYTEPS_ELASTIC": "1", "BYTEPS_ELASTIC_MIN_WORKERS": str(low),
               "BYTEPS_ELASTIC_MAX_WORKERS": str(high), "BYTEPS_LOCAL_SIZE": "1"}
    if elastic_timeout is not None:
        elastic["BYTEPS_ELASTIC_TIMEOUT"] = f"{elastic_timeout:g}"
    if reset_limit is not None:
        elastic["BYTEPS_ELASTIC_RESET_LIMIT"] = str(reset_limit)
    driver = JobDriver(context.getConf().get("spark.driver.host") or "127.0.0.1", job_env,
                       start_timeout, verbose, stdout, stderr, prefix_output_with_timestamp)
    tag = f"tf_bps-spark-{driver.secret[:12]}"
    try:
        variables = driver.start_elastic_job(num_proc, elastic)
        asked = verbose >= 2 or "TF_CPP_MIN_LOG_LEVEL" in job_env
        plan = TaskPlan(driver.address, driver.secret,
                        cloudpickle.dumps((fn, args, dict(kwargs or {}))),
                        {**job_env, **variables}, stdout is not None, stderr is not None,
                        hide_tf_notices=not asked)
        driver.cancel_spark = lambda: context.cancelJobsWithTag(tag)
        context.addJobTag(tag)
        driver.watch_start(num_proc, needed=low)
        try:
            rdd = context.parallelize(range(num_proc), num_proc)
            outcomes = rdd.mapPartitions(elastic_task(plan, num_proc)).collect()
        except Exception as error:  # py4j's error, which pyspark may wrap
            reason = driver.cancel_reason or f"Spark failed the job: {_first_line(error)}"
            raise SparkJobError(f"tf_bps.spark.run_elastic failed: {reason}") from None
        finally:
            context.removeJobTag(tag)
    finally:
        driver.close()
    succeeded = sorted((p, payload) for p, _, kind, payload in outcomes if kind == "ok")
    failed = sorted((p, a, payload) for p, a, kind, payload in outcomes if kind != "ok")
    for partition, attempt, message in failed:
        driver.say(f"task {partition} (attempt {attempt}) failed:\n{message}")
    if not succeeded:
        partition, attempt, message = failed[0]
        raise SparkJobError(f"every rank failed; task {partition} (attempt {attempt}):\n"
                            f"{message}")
    return [pickle.loads(payload) for _, payload in succeeded]
