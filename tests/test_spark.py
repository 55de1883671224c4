"""tf_bps.spark.run on a real Spark cluster of this machine: local-cluster[2,1,1024] (a
standalone master, two workers and an executor JVM each, as pip's pyspark ships them),
started once for the module. Both executors are on this machine, so Spark's task
addresses give one host of two workers; tf_bps/spark/layout.py's other layouts are
checked from addresses alone."""

import io
import os
import re
import shutil
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine
pyspark = pytest.importorskip("pyspark")
if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
    pytest.skip("pyspark needs Java 17 (apt-get install default-jre-headless)",
                allow_module_level=True)

import numpy as np  # noqa: E402
from pyspark import SparkConf, SparkContext, cloudpickle  # noqa: E402

import tf_bps.spark  # noqa: E402
from tf_bps.spark.layout import plan_layout  # noqa: E402

# The functions below travel to the executors by value: they cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

START_S = 90  # the cluster's executors must have registered by then


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """One SparkContext on local-cluster, for the whole module, with the UI off and its
    scratch space in a temporary folder; executors run this Python (PYSPARK_PYTHON)."""
    saved = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    local = tmp_path_factory.mktemp("spark")
    conf = (SparkConf().setMaster("local-cluster[2,1,1024]").setAppName("tf_bps-test")
            .set("spark.ui.enabled", "false").set("spark.local.dir", str(local))
            .set("spark.worker.dir", str(local / "work"))
            .set("spark.executor.memory", "512m")
            .set("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s"))
    context = SparkContext(conf=conf)
    try:
        context.setLogLevel("ERROR")
        deadline = time.monotonic() + START_S
        # The driver counts itself among the block managers: 1 + 2 executors.
        while context._jsc.sc().getExecutorMemoryStatus().size() < 3:
            assert time.monotonic() < deadline, "Spark's executors did not register"
            time.sleep(0.2)
        yield context
    finally:
        app = context.applicationId
        context.stop()
        # local-cluster's workers keep each executor's files and logs in
        # $SPARK_HOME/work/<app> (they ignore spark.worker.dir): ours go.
        shutil.rmtree(Path(_spark_home()) / "work" / app, ignore_errors=True)
        if saved is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = saved


def _spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return os.environ.get("SPARK_HOME") or _find_spark_home()


def _train(steps: int) -> dict:
    """A small Keras model trained with bps.DistributedOptimizer, each rank on its own
    data; returns what the test compares."""
    import keras
    import numpy as np

    import tf_bps as bps

    bps.init()
    rng = np.random.default_rng(bps.rank())
    x = rng.normal(size=(16 * steps, 8)).astype("float32")
    y = x @ np.linspace(-1, 1, 8, dtype="float32")[:, None]
    keras.utils.set_random_seed(bps.rank())  # different on purpose: rank 0's win
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                        callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0)])
    print(f"rank {bps.rank()} trained", flush=True)
    return {"rank": bps.rank(), "size": bps.size(), "local_rank": bps.local_rank(),
            "local_size": bps.local_size(), "loss": history.history["loss"][-1],
            "weights": model.get_weights(), "token": os.environ["BYTEPS_JOB_TOKEN"]}


def test_run_trains_and_returns_results_in_rank_order(spark):
    stdout, stderr = io.StringIO(), io.StringIO()
    results = tf_bps.spark.run(_train, args=(6,), num_proc=2, start_timeout=120,
                               stdout=stdout, stderr=stderr,
                               prefix_output_with_timestamp=True)
    assert [r["rank"] for r in results] == [0, 1]
    assert {(r["size"], r["local_size"]) for r in results} == {(2, 2)}
    assert [r["local_rank"] for r in results] == [0, 1]
    assert np.isfinite(results[0]["loss"])
    for mine, theirs in zip(results[0]["weights"], results[1]["weights"], strict=True):
        np.testing.assert_array_equal(mine, theirs)
    # Each rank's lines reach the driver tagged with its rank, after the time.
    for rank in (0, 1):
        assert re.search(rf"^\w{{3}} \w{{3}} +\d+ [\d:]+ \d{{4}} \[{rank}\]<stdout>:rank "
                         rf"{rank} trained$", stdout.getvalue(), re.M), stdout.getvalue()
    assert "attempt 0: 2 process(es) on 1 machine(s)" in stderr.getvalue()
    assert "oneDNN" not in stderr.getvalue()  # TensorFlow's start-up notices: dropped
    # A run is a job of its own: the next one has another token.
    again = tf_bps.spark.run(_token, num_proc=2, verbose=0)
    assert again[0] != results[0]["token"]


def _token() -> str:
    """The job's token, from a rank that joined it without TensorFlow."""
    import tf_bps as bps

    bps.init()
    return os.environ["BYTEPS_JOB_TOKEN"]


def _sum_for_a_while(fail_rank: int | None = None, seconds: float = 60) -> int:
    """Sums with the other ranks for `seconds`; rank `fail_rank` raises once the job
    has formed, which stops the others."""
    import numpy as np

    import tf_bps as bps

    bps.init()
    if bps.rank() == fail_rank:
        raise ValueError(f"rank {fail_rank} gives up")
    steps, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        bps.push_pull(np.ones(4, np.float32), name="ones", average=False)
        steps += 1
        time.sleep(0.01)
    return steps


def _job_processes(mark: str, also: str = "") -> list[str]:
    """This machine's processes whose environment holds `mark` (and `also`): the job's."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes() if proc.name.isdigit() else b""
            if mark.encode() in environ and also.encode() in environ:
                found.append(f"{proc.name}: {(proc / 'cmdline').read_bytes()!r}")
        except OSError:
            continue
    return found


def _executor_of(pid: int) -> int | None:
    """The executor JVM above a process of a task (worker, pyspark worker, daemon)."""
    while pid > 1:
        try:
            if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None


def test_failing_rank_fails_run_naming_it_and_leaves_no_process(spark):
    mark = f"tf_bps_spark_test_{uuid.uuid4().hex}"
    started = time.monotonic()
    with pytest.raises(tf_bps.spark.SparkJobError) as failure:
        tf_bps.spark.run(_sum_for_a_while, args=(1,), num_proc=2, start_timeout=120,
                         env={"TF_BPS_SPARK_TEST_MARK": mark}, verbose=0)
    message = str(failure.value)
    assert message.startswith("rank 1 failed:"), message
    assert "ValueError: rank 1 gives up" in message
    assert time.monotonic() - started < 50  # not the 60 s rank 0 would sum alone
    _assert_none_left(mark)


def _assert_none_left(mark: str) -> None:
    deadline = time.monotonic() + 10
    while _job_processes(mark):
        assert time.monotonic() < deadline, _job_processes(mark)
        time.sleep(0.2)


def _never_called() -> None:
    raise AssertionError("no task should start")


def test_more_ranks_than_slots_times_out_clearly(spark):
    with pytest.raises(tf_bps.spark.SparkJobError, match=r"timed out after 3 s waiting for "
                       r"the Spark tasks to start \(0 of 3 started\)"):
        tf_bps.spark.run(_never_called, num_proc=3, start_timeout=3, verbose=0)


def test_lost_executor_fails_run_and_ends_the_job(spark):
    """Killing the executor JVM of rank 1 mid-job: Spark gives up the barrier stage (it
    never retries a barrier result stage) and run says so; every process of the job,
    on both executors and in the driver, is gone. (The cluster starts a new executor in
    its place.)"""
    mark = f"tf_bps_spark_test_{uuid.uuid4().hex}"
    killed = []

    def kill_rank_1_executor():
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not killed:
            for found in _job_processes(mark, also="HOROVOD_RANK=1\0"):
                executor = _executor_of(int(found.split(":")[0]))
                if executor:
                    time.sleep(2)  # let the job form and sum a while
                    os.kill(executor, signal.SIGKILL)
                    killed.append(executor)
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_1_executor, daemon=True)
    killer.start()
    with pytest.raises(tf_bps.spark.SparkJobError) as failure:
        tf_bps.spark.run(_sum_for_a_while, kwargs={"seconds": 45}, num_proc=2,
                         start_timeout=120, env={"TF_BPS_SPARK_TEST_MARK": mark}, verbose=0)
    killer.join(timeout=5)
    assert killed, "rank 1's executor was not found"
    assert "Spark failed the job" in str(failure.value), failure.value
    assert "barrier" in str(failure.value), failure.value
    _assert_none_left(mark)


def _count_elastically(steps: int, full_size: int) -> dict:
    """Counts steps inside tf_bps.elastic.run, each summing ones over the job (the sum
    must be its size), commits every 5, and ends past `steps` once the job is back to
    `full_size` (every rank sees the same step and size, so they end together)."""
    import tensorflow as tf

    import tf_bps as bps
    import tf_bps.elastic as elastic

    bps.init()
    weight = tf.Variable(0.0)
    state = elastic.TensorFlowState([weight], step=0)
    sizes = set()
    deadline = time.monotonic() + 100
    print("READY", flush=True)

    @elastic.run
    def train(state):
        while state.step < steps or (bps.size() < full_size and time.monotonic() < deadline):
            total = bps.push_pull(tf.ones([4]), op=bps.Sum, name="count")
            assert float(total[0]) == bps.size(), (float(total[0]), bps.size())
            sizes.add(bps.size())
            weight.assign_add(1.0)
            state.step += 1
            if state.step % 5 == 0:
                state.commit()
            time.sleep(0.05)

    train(state)
    return {"step": state.step, "weight": float(weight.numpy()), "sizes": sorted(sizes),
            "name": os.environ["BYTEPS_ELASTIC_WORKER_NAME"]}


def test_run_elastic_survives_a_lost_executor(spark):
    """Rank 1's executor is killed once the job trains: rank 0 goes on, Spark runs task
    1 again on the executor the cluster starts in its place, and it joins the job."""
    mark = f"tf_bps_spark_test_{uuid.uuid4().hex}"
    stdout = io.StringIO()
    killed = []

    def kill_task_1_executor():
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "[1]<stdout>:READY" not in stdout.getvalue():
            time.sleep(0.2)
        for found in _job_processes(mark, also="spark-task-1.0\0"):
            executor = _executor_of(int(found.split(":")[0]))
            if executor:
                time.sleep(1)
                os.kill(executor, signal.SIGKILL)
                killed.append(executor)
                return

    killer = threading.Thread(target=kill_task_1_executor, daemon=True)
    killer.start()
    results = tf_bps.spark.run_elastic(_count_elastically, args=(100, 2), num_proc=2,
                                       min_num_proc=1, start_timeout=120, stdout=stdout,
                                       env={"TF_BPS_SPARK_TEST_MARK": mark}, verbose=0)
    killer.join(timeout=5)
    assert killed, "task 1's executor was not found"
    assert [r["name"] for r in results] == ["spark-task-0.0", "spark-task-1.1"], results
    assert results[0]["step"] == results[1]["step"] >= 100, results
    assert results[0]["weight"] == results[1]["weight"] == results[0]["step"], results
    assert results[0]["sizes"] == [1, 2], results
    _assert_none_left(mark)


def test_layout_from_task_addresses():
    even = plan_layout(["10.0.0.1:4000", "10.0.0.1:4001", "10.0.0.2:4000", "10.0.0.2:4001"])
    assert (even.local_size, even.machines, even.reason) == (2, ("10.0.0.1", "10.0.0.2"), "")
    assert [even.variables(p)["DMLC_WORKER_ID"] for p in range(4)] == ["0", "0", "1", "1"]
    assert [even.starts_server(p) for p in range(4)] == [True, False, True, False]
    assert even.variables(3)["DMLC_NUM_SERVER"] == "2"
    # Interleaved or uneven: every task a host of its own; the rank stays the partition.
    for addresses in (["a:1", "b:1", "a:2", "b:2"], ["a:1", "a:2", "b:1"]):
        layout = plan_layout(addresses)
        assert layout.local_size == 1 and layout.reason
        assert [layout.variables(p)["DMLC_WORKER_ID"] for p in range(len(addresses))] == \
            [str(p) for p in range(len(addresses))]
        assert layout.variables(0)["DMLC_NUM_SERVER"] == "2"
    alone = plan_layout(["[::1]:5000"])
    assert alone.hosts == ("::1",) and not alone.starts_server(0)
    assert "DMLC_NUM_SERVER" not in alone.variables(0)
