"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1): servers keep the parameters, workers
push weight deltas and never wait for each other."""

import sys

import pytest
from harness import LAUNCH, WORKERS, base_env, finish, free_port, marked_json, worker_command

import tf_bps as bps


@pytest.mark.parametrize("mode", ["optimizer", "strategy"])
def test_a_fast_worker_does_not_wait_for_a_slow_one_and_both_converge(procs, mode):
    status, output = procs.launch(2, "async_training.py", mode, "3", num_servers=1,
                                  BYTEPS_ENABLE_ASYNC=1)
    assert status == 0, output
    reports = marked_json(output)
    fast, slow = reports[0], reports[1]
    # Rank 1 sleeps 0.2 s a step, so it makes about 15 steps in 3 s; synchronous
    # training would hold rank 0 to the same count. (Rank 0 makes hundreds to
    # thousands, depending on the load, and both converge far below 1e-3 within 2 s:
    # 3 s of training instead of 5 tell the two apart as well.)
    assert slow["steps"] >= 3, output
    assert fast["steps"] >= 5 * slow["steps"], (fast["steps"], slow["steps"])
    for report in reports.values():  # Both end at the servers' (converged) parameters.
        assert report["loss"] < 1e-3, report
    # The servers start from rank 0's values: a step that changes nothing gives every
    # worker rank 0's value of a variable that began as rank + 1.
    assert slow["probe"] == fast["probe"] == [1.0, 1.0, 1.0]
    if mode == "strategy":  # The strategy creates every variable from rank 0's value.
        assert slow["initial_kernel"] == fast["initial_kernel"]
    else:
        assert slow["initial_kernel"] != fast["initial_kernel"]


def test_horovods_keras_example_trains_asynchronously(procs, tmp_path):
    # Horovod's (and BytePS's) Keras MNIST pattern: a model Keras builds inside the first
    # step, the broadcast and metric callbacks, and a checkpoint on rank 0.
    drop_in = WORKERS / "drop_in"
    status, output = procs.run(
        [*LAUNCH, "-np", "2", "--", sys.executable, str(drop_in / "horovod_keras_fit.py")],
        base_env(PYTHONPATH=str(drop_in), DROP_IN_OUT=str(tmp_path), BYTEPS_STYLE=1,
                 BYTEPS_ENABLE_ASYNC=1), timeout=240)
    assert status == 0, output
    assert sorted(marked_json(output, "WEIGHTS")) == [0, 1], output


def test_servers_without_async_refuse_asynchronous_workers(procs):
    common = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": free_port(),
              "DMLC_NUM_WORKER": 2, "DMLC_NUM_SERVER": 1, "BYTEPS_OP_TIMEOUT": 30}
    procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **common))
    procs.start(LAUNCH, base_env(DMLC_ROLE="server", **common))
    workers = [procs.start([*LAUNCH, *worker_command("async_training.py", "optimizer", "1")],
                           base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=rank,
                                    BYTEPS_ENABLE_ASYNC=1, **common))
               for rank in range(2)]
    status, output = finish(workers[0], 90)
    assert status != 0
    assert ("this server runs without BYTEPS_ENABLE_ASYNC=1: set it on every worker and "
            "server") in output, output


@pytest.mark.parametrize("build,message,env", [
    (lambda: bps.DistributedGradientTape(None), "DistributedGradientTape cannot train "
                                                "asynchronously", {}),
    (lambda: bps.DistributedOptimizer(_keras_sgd(), compression=bps.Compression.fp16),
     "compression=Compression.fp16 does not apply with BYTEPS_ENABLE_ASYNC=1", {}),
    (lambda: bps.DistributedOptimizer(_v1_sgd()), "a tf.compat.v1 optimizer cannot train "
                                                  "asynchronously", {}),
    (lambda: bps.DistributedOptimizer(_keras_sgd()), "PERSEUS_DOWNSAMPLE_N_ELEMENTS=2 works on "
     "synchronised gradients", {"PERSEUS_DOWNSAMPLE_N_ELEMENTS": "2"}),
])
def test_what_cannot_train_asynchronously_says_so(monkeypatch, build, message, env):
    monkeypatch.setenv("BYTEPS_ENABLE_ASYNC", "1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        build()


def _keras_sgd():
    import keras
    return keras.optimizers.SGD(0.1)


def _v1_sgd():
    import tensorflow as tf
    return tf.compat.v1.train.GradientDescentOptimizer(0.1)
