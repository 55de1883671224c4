"""tf_bps on Ray (tf_bps.ray): the rank layout alone, then jobs through a real local Ray
cluster of two nodes on this machine (ray.cluster_utils.Cluster: a head and a second
raylet, each with its own object store), started once for the module.

Every Ray process is pinned to 127.0.0.1 (Ray otherwise advertises this machine's
other address, where nothing answers), keeps its files in a folder of the test's own,
and sends no usage statistics."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from harness import base_env, finish, worker_command

from tf_bps.ray.layout import WorkerNode, plan_job

# -- the layout, without Ray ------------------------------------------------------------


def test_workers_of_even_nodes_are_ranked_node_by_node_with_local_ranks():
    nodes = [WorkerNode("b", "10.0.0.2", ("0",)), WorkerNode("a", "10.0.0.1", ("1",)),
             WorkerNode("b", "10.0.0.2", ("3",)), WorkerNode("a", "10.0.0.1", ("0",))]
    layout = plan_job(nodes)
    assert layout.actor_of_rank == (0, 2, 1, 3)
    assert layout.nodes == ("b", "a") and layout.addresses == ("10.0.0.2", "10.0.0.1")
    assert layout.local_size == 2
    fields = ("DMLC_WORKER_ID", "BYTEPS_LOCAL_RANK", "DMLC_NUM_WORKER", "DMLC_NODE_HOST")
    assert [tuple(v[f] for f in fields) for v in layout.variables] == [
        ("0", "0", "2", "10.0.0.2"), ("0", "1", "2", "10.0.0.2"),
        ("1", "0", "2", "10.0.0.1"), ("1", "1", "2", "10.0.0.1")]
    # Each worker of a node sees the node's GPUs, its own at its local rank's index.
    assert [v["CUDA_VISIBLE_DEVICES"] for v in layout.variables] == ["0,3", "0,3", "1,0", "1,0"]


def test_uneven_nodes_make_every_worker_a_host_of_its_own():
    nodes = [WorkerNode("a", "h1", ("0",)), WorkerNode("a", "h1", ("1",)),
             WorkerNode("b", "h2", ("0",))]
    layout = plan_job(nodes)
    assert layout.local_size == 1
    assert [v["DMLC_WORKER_ID"] for v in layout.variables] == ["0", "1", "2"]
    assert {v["DMLC_NUM_WORKER"] for v in layout.variables} == {"3"}
    # Horovod's local ranks still describe the node; the GPUs stay Ray's own choice.
    assert [v["HOROVOD_LOCAL_RANK"] for v in layout.variables] == ["0", "1", "0"]
    assert not any("CUDA_VISIBLE_DEVICES" in v for v in layout.variables)


def test_executor_arguments_are_checked_before_ray_is_asked():
    ray_executor = pytest.importorskip("tf_bps.ray").RayExecutor
    with pytest.raises(ValueError, match="either num_workers, or num_hosts"):
        ray_executor(num_workers=2, num_hosts=2)
    with pytest.raises(ValueError, match="num_workers must be a positive integer"):
        ray_executor(num_workers=0)
    with pytest.raises(ValueError, match="needs use_gpu=True"):
        ray_executor(num_workers=1, gpus_per_worker=1)


# -- jobs on a local Ray cluster ----------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    """A head node and a second node, two logical CPUs each; ray.init()ed here."""
    pytest.importorskip("ray")
    saved = dict(os.environ)
    folder = tempfile.mkdtemp(prefix="tfbps-ray-")  # short: Ray's socket paths live in it
    # The nodes' processes take these from ours; tests/workers must be importable in the
    # workers, which unpickle the training functions from it.
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is what keeps Ray's own address look-ups on
    # 127.0.0.1 (ray.init() would otherwise turn the head's 127.0.0.1 into the other one).
    os.environ.update(base_env(RAY_TMPDIR=folder, RAY_USAGE_STATS_ENABLED="0",
                               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"))
    import ray
    import ray.cluster_utils
    from ray._private import ray_constants

    # The same switch for this process, which may have imported Ray before.
    ray_constants.ENABLE_RAY_CLUSTER = False
    node = {"node_ip_address": "127.0.0.1", "num_cpus": 2,
            "object_store_memory": 80 * 2**20}
    cluster = ray.cluster_utils.Cluster(initialize_head=True,
                                        head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1")
        # This module's functions travel by value: the workers cannot import a test.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def four_workers(ray_cluster):
    """A job of 4 workers that Ray packs onto the two nodes (2 + 2)."""
    from tf_bps.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=90), num_workers=4)
    started = time.monotonic()
    executor.start(executable_cls=dict, executable_kwargs={"made_by": "start"})
    executor.start_seconds = time.monotonic() - started
    try:
        yield executor
    finally:
        executor.shutdown()


def _train(mode: str, out: str) -> dict:
    """One case of tests/workers/train.py in this worker (rank and size from the job)."""
    import argparse

    import train

    import tf_bps as bps

    args = argparse.Namespace(mode=mode, optimizer="sgd", passes=1, compression="none",
                              out=out, local_replicas=1, reference=False)
    if mode == "strategy":
        train.train_with_strategy(args)  # ends with bps.shutdown(): the job's last run
    else:
        train.train(args, bps, name="case0")
    return {"rank": bps.rank() if bps.is_initialized() else None, "pid": os.getpid()}


def _weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[key] for key in sorted(saved.files, key=lambda k: int(k.split("_")[1]))]


def _start_reference(procs, workers: int, out: Path):
    """train.py's strategy case as one process on the whole global batch of `workers`."""
    out.mkdir()
    return procs.start(worker_command("train.py", "--mode", "strategy", "--reference",
                                      "--workers", str(workers), "--out", str(out)), base_env())


def _reference_weights(reference, out: Path) -> list[np.ndarray]:
    status, output = finish(reference, timeout=120)
    assert status == 0, output
    return _weights(out / "rank0.npz")


def _assert_close(ours: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    for mine, other in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(mine, other, rtol=1e-5, atol=1e-6)


@pytest.mark.engine
def test_ray_job_trains_as_one_process_on_the_global_batch(four_workers, procs, tmp_path):
    layout = four_workers.layout
    assert layout.local_size == 2 and len(layout.nodes) == 2, layout
    ranks = four_workers.execute(lambda made: (__import__("tf_bps").rank(), made))
    assert ranks == [(rank, {"made_by": "start"}) for rank in range(4)]
    assert four_workers.execute_single(lambda _: __import__("tf_bps").local_rank()) == 0
    # One process on the whole global batch of 4 workers: where both ways of training
    # below must end (tests/test_training.py holds bpslaunch jobs to the same).
    reference = _start_reference(procs, 4, tmp_path / "reference")

    # DistributedOptimizer under fit.
    fit_out = tmp_path / "fit"
    fit_out.mkdir()
    results = four_workers.run(_train, args=("fit", str(fit_out)))
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert len({r["pid"] for r in results}) == 4
    # The strategy under fit.
    strategy_out = tmp_path / "strategy"
    strategy_out.mkdir()
    four_workers.run(_train, args=("strategy", str(strategy_out)))
    expected = _reference_weights(reference, tmp_path / "reference")
    for rank in range(4):
        _assert_close(_weights(fit_out / f"rank{rank}.npz"), expected)
        _assert_close(_weights(strategy_out / f"rank{rank}.npz"), expected)
    # The training function left the job: the executor says so instead of hanging.
    with pytest.raises(RuntimeError, match="not in a job any more"):
        four_workers.run(len, args=([],))
    print(f"Ray job of 4 formed in {four_workers.start_seconds:.1f} s")


def _fail_on_rank_one(seen: str) -> None:
    """Rank 1 raises; rank 0 waits for the job to end because of it and writes why."""
    import tf_bps as bps
    from tf_bps.runtime import core

    if bps.rank() == 1:
        raise ValueError("bad batch on rank 1")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not core.worker_failure():
        time.sleep(0.1)
    Path(seen).write_text(core.worker_failure() or "no failure seen")


@pytest.mark.engine
def test_a_failing_rank_ends_the_job_naming_it_and_leaves_no_process(ray_cluster, tmp_path):
    from tf_bps.ray import RayExecutor

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2)
    try:
        executor.start()
        assert len(executor.layout.nodes) == 2  # num_hosts: one node each
        seen = tmp_path / "seen_by_rank_0"
        with pytest.raises(RuntimeError, match="worker rank 1 failed.*bad batch on rank 1"):
            executor.run(_fail_on_rank_one, args=(str(seen),))
        deadline = time.monotonic() + 90
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        # The scheduler ended rank 0's job at once, naming rank 1 and its error.
        assert "worker rank 1" in seen.read_text() and "bad batch" in seen.read_text()
        with pytest.raises(RuntimeError, match="the job failed"):
            executor.run(len, args=([],))
        pids = executor.job_process_ids
        assert len(pids) == 3  # the scheduler and a server on each node
    finally:
        executor.shutdown()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _ray_train_loop(config: dict) -> None:
    """Ray Train's training function: the strategy places itself from the TF_CONFIG that
    TensorflowTrainer set, with nothing of tf_bps.ray."""
    import argparse

    import train

    assert "TF_CONFIG" in os.environ
    train.train_with_strategy(argparse.Namespace(optimizer="sgd", out=config["out"]))


@pytest.mark.engine
def test_ray_train_tensorflow_trainer_runs_the_strategy_from_tf_config(ray_cluster, procs,
                                                                        tmp_path):
    pytest.importorskip("ray.train.tensorflow")
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    out = tmp_path / "ray_train"
    out.mkdir()
    reference = _start_reference(procs, 2, tmp_path / "reference")
    trainer = TensorflowTrainer(
        _ray_train_loop, train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="tf_bps", storage_path=str(tmp_path / "results")))
    result = trainer.fit()
    assert result.error is None, result.error
    expected = _reference_weights(reference, tmp_path / "reference")
    for rank in range(2):
        _assert_close(_weights(out / f"rank{rank}.npz"), expected)


def _elastic_training(folder: str) -> dict:
    """Trains in tf_bps.elastic.run until the test writes `stop`: each step push_pulls
    ones (their sum must be the job's size) and rank 0 appends the size to `sizes`."""
    import tensorflow as tf

    import tf_bps as bps
    import tf_bps.elastic as elastic

    bps.init()
    weight = tf.Variable(0.0)
    state = elastic.TensorFlowState([weight], step=0)
    seen = []

    @elastic.run
    def train(state):
        while True:
            total = bps.push_pull(tf.ones([100]), op=bps.Sum, name="elastic_ray")
            if float(total[0]) != bps.size():
                raise AssertionError(f"a sum of {float(total[0])} in a job of {bps.size()}")
            if not seen or seen[-1] != bps.size():
                seen.append(bps.size())
                if bps.rank() == 0:
                    with open(os.path.join(folder, "sizes"), "a") as sizes:
                        sizes.write(f"{bps.size()}\n")
            weight.assign_add(1.0)
            state.step += 1
            stop = float(os.path.exists(os.path.join(folder, "stop")))
            if float(bps.push_pull(tf.constant([stop]), op=bps.Sum, name="elastic_stop")[0]):
                return
            if state.step % 5 == 0:
                state.commit()
            time.sleep(0.05)

    train(state)
    return {"rank": bps.rank(), "size": bps.size(), "steps": state.step,
            "weight": float(weight.numpy()), "seen": seen}


@pytest.mark.engine
def test_elastic_ray_job_grows_with_a_node_added_and_shrinks_with_it_removed(ray_cluster,
                                                                             tmp_path):
    from tf_bps.ray import ElasticRayExecutor

    def sizes() -> list[int]:
        path = tmp_path / "sizes"
        return [int(line) for line in path.read_text().split()] if path.exists() else []

    def wait_for_size(size: int) -> None:
        deadline = time.monotonic() + 120
        while (not sizes() or sizes()[-1] != size) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert sizes() and sizes()[-1] == size, sizes()

    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(timeout_s=60),
                                  min_workers=1, max_workers=3, cpus_per_worker=2)
    executor.start()
    import threading

    results = {}
    runner = threading.Thread(target=lambda: results.update(
        out=executor.run(_elastic_training, args=(str(tmp_path),))))
    try:
        runner.start()
        wait_for_size(2)  # one worker on each node
        added = ray_cluster.add_node(node_ip_address="127.0.0.1", num_cpus=2,
                                     object_store_memory=80 * 2**20)
        wait_for_size(3)
        ray_cluster.remove_node(added)
        wait_for_size(2)
        (tmp_path / "stop").write_text("")
        runner.join(timeout=120)
        assert not runner.is_alive()
    finally:
        (tmp_path / "stop").write_text("")
        runner.join(timeout=60)
        executor.shutdown()
    assert sizes() == [2, 3, 2]
    finished = results["out"]
    assert sorted(r["rank"] for r in finished) == [0, 1], finished
    # The two survivors trained together to the end: the same steps and weight.
    assert len({(r["steps"], r["weight"]) for r in finished}) == 1, finished
    assert executor.sizes_started[:2] == [2, 3]
