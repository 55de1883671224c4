"""Training through tf_bps matches one process trained on the global batch."""

import re
import sys

import numpy as np
import pytest
from harness import base_env, finish, marked_json, module_job, worker_command


def trained(output: str, case: str | None = None) -> dict[int, dict]:
    """The workers' TRAINED reports (of one case, where a job trains several)."""
    lines = [line for line in output.splitlines() if case is None or f'"case{case}"' in line]
    return marked_json("\n".join(lines), "TRAINED")


CASES = [
    # mode, optimizer, passes, compression, tolerance
    ("fit", "sgd", 1, "none", 1e-5),
    ("fit_eager", "adam", 1, "none", 1e-5),
    ("tape", "sgd", 1, "none", 1e-5),
    ("tape_function", "adam", 1, "none", 1e-5),
    ("fit", "sgd", 2, "none", 1e-5),
    ("fit", "adam", 1, "fp16", 2e-2),
    ("tape_function", "sgd", 1, "fp16", 2e-2),
    ("fit", "adamw_schedule_clip", 1, "none", 1e-5),
    ("loop_optimizer", "loss_scale", 1, "none", 1e-5),
    ("strategy", "sgd", 1, "none", 1e-5),
    ("strategy", "adam", 1, "none", 1e-5),
]


# Every case but the strategy's trains in one job (and one reference process), case
# after case, each with a model of its own named case<index>: one start of TensorFlow
# in each process instead of one per case. The strategy's cases run alone: the strategy
# takes over the whole process.
SHARED = [case for case in CASES if case[0] != "strategy"]


def _case_id(case) -> str:
    mode, optimizer, passes, compression, _ = case
    return f"{mode}-{optimizer}-passes{passes}-{compression}"


def _train(procs, out, args: list[str], timeout: float = 120):
    """train.py under bpslaunch -np 2 and, meanwhile, as the reference: the job's output
    and the reference's."""
    (out / "ref").mkdir(parents=True)
    (out / "dist").mkdir()
    # The reference trains while the job starts: most of both is importing TensorFlow.
    reference = procs.start(
        worker_command("train.py", *args, "--reference", "--out", str(out / "ref")),
        base_env())
    status, output = procs.launch(2, "train.py", *args, "--out", str(out / "dist"),
                                  BYTEPS_LOG_LEVEL="DEBUG", timeout=timeout)
    assert status == 0, output
    status, reference_output = finish(reference, timeout=timeout)
    assert status == 0, reference_output
    return output, reference_output


@module_job
def shared_job(processes, tmp_path_factory):
    out = tmp_path_factory.mktemp("shared")
    cases = ",".join(f"{m}/{o}/{p}/{c}" for m, o, p, c, _ in SHARED)
    return out, *_train(processes, out, ["--cases", cases], timeout=400)


# The reference of the strategy's SGD case: one process, trained on the global batch,
# that two tests (the case, and the one with two local replicas) compare their jobs
# with. Run once for both: it is the same run, and TensorFlow's start is most of it.
STRATEGY_SGD = ["--mode", "strategy", "--optimizer", "sgd"]


@module_job
def strategy_reference(processes, tmp_path_factory):
    out = tmp_path_factory.mktemp("strategy_reference")
    status, output = processes.run(
        worker_command("train.py", *STRATEGY_SGD, "--reference", "--out", str(out)),
        base_env())
    assert status == 0, output
    return out, output


@pytest.mark.parametrize("mode,optimizer,passes,compression,tolerance", CASES,
                         ids=[_case_id(case) for case in CASES])
def test_two_workers_match_one_process_on_the_global_batch(
        request, procs, tmp_path, mode, optimizer, passes, compression, tolerance):
    case = (mode, optimizer, passes, compression, tolerance)
    if case in SHARED:
        out, output, reference_output = request.getfixturevalue("shared_job")
        index = SHARED.index(case)
        ref, dist = out / "ref" / str(index), out / "dist" / str(index)
        # This case's gradients, by its model's name (case3/dense/kernel, ...).
        fused = rf"tensor '[^']*\bcase{index}/[^']*\.fused\d+' moved"
    else:
        args = ["--mode", mode, "--optimizer", optimizer, "--passes", str(passes),
                "--compression", compression]
        if (mode, optimizer, passes, compression) == ("strategy", "sgd", 1, "none"):
            ref, reference_output = request.getfixturevalue("strategy_reference")
            dist = tmp_path / "dist"
            dist.mkdir()
            status, output = procs.launch(2, "train.py", *args, "--out", str(dist),
                                          BYTEPS_LOG_LEVEL="DEBUG")
            assert status == 0, output
        else:
            output, reference_output = _train(procs, tmp_path, args)
            ref, dist = tmp_path / "ref", tmp_path / "dist"
        fused = r"tensor '[^']+\.fused\d+' moved"
    # The model's gradients are all small: they share rounds (BYTEPS_FUSION_THRESHOLD).
    assert re.search(fused, output), output
    reference = np.load(ref / "rank0.npz")
    workers = [np.load(dist / f"rank{r}.npz") for r in range(2)]
    for key in reference:
        np.testing.assert_array_equal(workers[0][key], workers[1][key], err_msg=key)
        np.testing.assert_allclose(workers[0][key], reference[key], rtol=tolerance,
                                   atol=tolerance, err_msg=key)
    if passes > 1:
        # As in Horovod, iterations counts every pass, applied or not: a learning-rate
        # schedule runs at the pace of the passes.
        reports = trained(output, str(index) if case in SHARED else None)
        steps = trained(reference_output, str(index) if case in SHARED else None)[0]
        assert sorted(reports) == [0, 1], output
        for report in reports.values():
            assert report["iterations"] == passes * steps["iterations"], (report, steps)
    if mode == "strategy":
        # fit's reported loss is the mean over all workers, as one process reports it.
        reference_loss = trained(reference_output)[0]["loss"]
        for report in trained(output).values():
            assert report["loss"] == pytest.approx(reference_loss, rel=1e-5)
    # Training moved the weights far more than the workers differ from the reference,
    # so a run that applied nothing (or only local gradients) cannot pass.
    initial = np.load(ref / "init0.npz")
    moved = max(np.abs(reference[k] - initial[k]).max() for k in reference)
    error = max(np.abs(workers[0][k] - reference[k]).max() for k in reference)
    assert moved > 10 * error and moved > 1e-3, (moved, error)


def test_strategy_with_two_local_replicas_per_worker(procs, tmp_path, strategy_reference):
    (tmp_path / "dist").mkdir()
    status, output = procs.launch(2, "train.py", *STRATEGY_SGD, "--local-replicas", "2",
                                  "--out", str(tmp_path / "dist"))
    assert status == 0, output
    assert output.count('"replicas": 4') == 2, output
    reference = np.load(strategy_reference[0] / "rank0.npz")
    workers = [np.load(tmp_path / "dist" / f"rank{r}.npz") for r in range(2)]
    for key in reference:
        np.testing.assert_array_equal(workers[0][key], workers[1][key], err_msg=key)
        np.testing.assert_allclose(workers[0][key], reference[key], rtol=1e-5, atol=1e-5)


def test_single_process_path_needs_no_job(procs, tmp_path):
    status, output = procs.run(
        [sys.executable, str(worker_command("train.py")[1]), "--out", str(tmp_path)],
        base_env())
    assert status == 0 and "TRAINED" in output, output
