"""AIACC-Training's variables (PERSEUS_*, GLOO_*): what each does here, through a real
job, and how the ones that do nothing here or cannot work are treated."""

import re

import numpy as np
import pytest
from harness import marked_json

from tf_bps.runtime.config import WITHOUT_EFFECT, Config, ConfigError


def test_perseus_options_in_a_job(procs):
    status, output = procs.launch(
        2, "perseus_options.py", num_servers=1, BYTEPS_LOG_LEVEL="DEBUG",
        PERSEUS_ALLREDUCE_DTYPE=0, PERSEUS_ALLREDUCE_GRADIENT_SCALE=4,
        PERSEUS_ALLREDUCE_FUSION=1, PERSEUS_ACCUMULATE_N_STEPS=2,
        PERSEUS_CHANGE_HVD_ALLGATHER=0, PERSEUS_ALLREDUCE_NANCHECK=1, PERSEUS_MASTER_PORT=6666,
        BYTEPS_LOCAL_MERGE=1)  # merged although the server is on the workers' host
    assert status == 0, output
    reports = marked_json(output)
    for report in reports.values():
        # Two local passes per synchronisation; their sums averaged over the workers:
        # kernel (0.25 + 0.5) x 2 / 2, bias (-0.5 - 1) x 2 / 2, applied with SGD(1).
        assert report["passes"] == 2
        assert report["kernel"] == [[-0.75] * 3] * 2 and report["bias"] == [1.5] * 3
        assert report["allgather_shape"] == [2, 1, 2]  # one entry per worker
    # The NaN fails its own worker, naming tensor, rank and step, and the round ends for
    # the other at once.
    assert "tensor 'nan_probe' holds NaN or Inf on worker rank 1 at step 1" in reports[1]["nan"]
    assert "worker rank 1 gave up round 1 of tensor 'nan_probe'" in reports[0]["nan"]
    # Fusion: kernel and bias travel as one buffer of 9 elements, as float16 (2 bytes),
    # one copy per host (the two workers merge locally).
    moved = dict(re.findall(r"tensor '([^']+)' moved (\d+) bytes in", output))
    assert moved.get("DistributedOptimizer.sequential/dense/kernel.fused2") == "18", moved
    assert not any(name.endswith(("/kernel", "/bias")) for name in moved), moved


def _down_sampled_kernel(steps: int, every: int, momentum: float, workers: int) -> np.ndarray:
    """What sampled_steps.py's kernel must hold: each step every worker sends its
    residual (decayed by the momentum) plus its gradient at the elements whose index is
    the step mod `every`, keeps the rest, and SGD(1.0) applies the average sent."""
    index = np.arange(5)
    kernel = np.zeros(5)
    residuals = [np.zeros(5) for _ in range(workers)]
    for step in range(steps):
        turn = index % every == step % every
        sent = []
        for rank in range(workers):
            carried = momentum * residuals[rank] + (rank + 1) * (index + 1.0)
            sent.append(np.where(turn, carried, 0.0))
            residuals[rank] = np.where(turn, 0.0, carried)
        kernel -= np.mean(sent, axis=0)
    return kernel


@pytest.mark.parametrize("mode", ["optimizer", "tape"])
def test_down_sampling_sends_a_share_of_each_gradient_and_a_slow_worker_is_reported(procs,
                                                                                     mode):
    status, output = procs.launch(
        2, "sampled_steps.py", mode, "6", num_servers=1, BYTEPS_LOG_LEVEL="DEBUG",
        PERSEUS_DOWNSAMPLE_N_ELEMENTS=2, PERSEUS_GRADIENT_MOMENTUM=0.5,
        PERSEUS_PERF_CHECK_N_STEPS=3, BYTEPS_LOCAL_MERGE=1)
    assert status == 0, output
    expected = _down_sampled_kernel(6, every=2, momentum=0.5, workers=2)
    for report in marked_json(output).values():
        np.testing.assert_allclose(report["kernel"], expected, rtol=1e-6)
    # 5 elements in turns of 2: 3 per step (one of them padding), 4 bytes each, one
    # copy per host (merged, BYTEPS_LOCAL_MERGE=1), 6 steps; the whole gradient would be
    # 20 bytes a step.
    moved = dict(re.findall(r"tensor '([^']+)' moved (\d+) bytes in", output))
    name = {"optimizer": "DistributedOptimizer.sequential/dense/kernel",
            "tape": "DistributedOptimizer.0.sequential/dense/kernel"}[mode]
    assert moved[name] == str(3 * 4 * 6), moved
    # Steps 3 and 6 end a window; rank 1 spent 0.3 s before each step, rank 0 almost
    # nothing (it waited inside the synchronisation instead).
    reports = re.findall(r"step-time check \(PERSEUS_PERF_CHECK_N_STEPS\) at step (\d+): "
                         r"worker rank (\d+) on (\S+) spends ([\d.]+) ms", output)
    assert [(step, rank) for step, rank, _, _ in reports] == [("3", "1"), ("6", "1")], output
    assert all(float(ms) > 250 for *_, ms in reports), reports


def test_the_step_time_check_reports_only_clear_outliers():
    from tf_bps.training.perf_check import outliers

    assert outliers([0.010, 0.300]) == [(1, 0.300, 0.010)]
    assert outliers([0.100, 0.110, 0.105, 0.400]) == [(3, 0.400, 0.105)]
    assert outliers([0.100, 0.140, 0.120]) == []  # within 1.5x of the others' median
    assert outliers([0.0001, 0.0009]) == []  # 9x, but under a millisecond apart


def _config(**env):
    return Config.from_env({k: str(v) for k, v in env.items()})


def test_perseus_variables_map_onto_ours():
    assert _config(GLOO_TIMEOUT_SECONDS=60).op_timeout == 60
    assert _config(GLOO_TIMEOUT_SECONDS=60, BYTEPS_OP_TIMEOUT=5).op_timeout == 5
    assert _config(PERSEUS_ALLREDUCE_STREAMS=6).scheduling_credit == 6
    assert _config(PERSEUS_ALLREDUCE_STREAMS=6, BYTEPS_SCHEDULING_CREDIT=3).scheduling_credit == 3
    assert _config(PERSEUS_GLOO_NETWORK_INTERFACE="eth1").interface == "eth1"
    assert [_config(PERSEUS_ALLREDUCE_DTYPE=v).wire_dtype for v in (0, 1, 2)] == [
        "float16", "float32", "mixed"]
    assert _config().wire_dtype is None and not _config().stacked_allgather
    for name in WITHOUT_EFFECT:  # accepted
        _config(**{name: 1})


@pytest.mark.parametrize("env,message", [
    ({"PERSEUS_ALLREDUCE_DTYPE": 3}, "PERSEUS_ALLREDUCE_DTYPE='3' is not valid"),
    ({"PERSEUS_ALLREDUCE_STREAMS": 13}, "PERSEUS_ALLREDUCE_STREAMS='13' is not valid"),
    ({"PERSEUS_ALLREDUCE_FUSION": 129}, "PERSEUS_ALLREDUCE_FUSION='129' is not valid"),
    ({"PERSEUS_GRADIENT_MOMENTUM": 1.5}, "PERSEUS_GRADIENT_MOMENTUM='1.5' is not valid"),
    ({"PERSEUS_ALLREDUCE_GRADIENT_SCALE": "nan"}, "PERSEUS_ALLREDUCE_GRADIENT_SCALE='nan'"),
    ({"GLOO_TIMEOUT_SECONDS": 0}, "GLOO_TIMEOUT_SECONDS='0' is not valid"),
    ({"PERSEUS_MASTER_PORT": 70000}, "PERSEUS_MASTER_PORT='70000' is not valid"),
    ({"PERSEUS_NCCL_ENABLE": 1}, "PERSEUS_NCCL_ENABLE=1 is not supported: it needs AIACC's"),
    ({"BYTEPS_SERVER_ENABLE_SCHEDULE": 1}, "BYTEPS_SERVER_ENABLE_SCHEDULE=1 is not supported"),
    ({"PERSEUS_DOWNSAMPLE_N_ELEMENTS": 0}, "PERSEUS_DOWNSAMPLE_N_ELEMENTS='0' is not valid"),
    ({"PERSEUS_PERF_CHECK_N_STEPS": -1}, "PERSEUS_PERF_CHECK_N_STEPS='-1' is not valid"),
])
def test_values_outside_the_documented_ranges_are_refused(env, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _config(**env)
