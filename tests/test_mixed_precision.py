"""Keras mixed precision across workers (tests/workers/mixed_precision.py): under
mixed_float16 a step whose gradients overflow on one worker is skipped on every worker
(the workers vote, tf_bps/training/loss_scale.py), whichever way the LossScaleOptimizer
and bps.DistributedOptimizer nest, and under ParameterServerStrategy; mixed_bfloat16
needs no loss scale. Each worker ends with the weights, the loss scale and the step count
of one process trained on the global batch."""

import numpy as np
import pytest
from harness import base_env, finish, marked_json, worker_command

CASES = ["compiled", "inner", "outer", "bfloat16"]


def _reports(output: str, case: str) -> dict[int, dict]:
    return marked_json("\n".join(line for line in output.splitlines()
                                 if f'"case": "{case}"' in line), "TRAINED")


@pytest.mark.parametrize("strategy", [False, True], ids=["optimizer", "strategy"])
def test_workers_skip_the_same_steps_and_match_one_process(procs, tmp_path, strategy):
    flags = ["--strategy"] if strategy else []
    (tmp_path / "ref").mkdir()
    (tmp_path / "dist").mkdir()
    reference = procs.start(worker_command("mixed_precision.py", *flags, "--reference",
                                           "--out", str(tmp_path / "ref")), base_env())
    status, output = procs.launch(2, "mixed_precision.py", *flags, "--out",
                                  str(tmp_path / "dist"), timeout=180)
    assert status == 0, output
    status, reference_output = finish(reference, timeout=180)
    assert status == 0, reference_output
    for case in ["strategy"] if strategy else CASES:
        alone = _reports(reference_output, case)[0]
        assert alone["iterations"] >= 2, alone  # steps were applied, not only skipped
        if case != "bfloat16":
            assert alone["scale"] < 2.0**15, alone  # the overflow was skipped, and halved
        reports = _reports(output, case)
        assert sorted(reports) == [0, 1], output
        for report in reports.values():
            assert (report["scale"], report["iterations"]) == (alone["scale"],
                                                               alone["iterations"]), case
        want = np.load(tmp_path / "ref" / f"{case}.0.npz")
        got = [np.load(tmp_path / "dist" / f"{case}.{rank}.npz") for rank in (0, 1)]
        for key in want:
            np.testing.assert_array_equal(got[0][key], got[1][key], err_msg=case)
            np.testing.assert_allclose(got[0][key], want[key], rtol=2e-3, atol=2e-3,
                                       err_msg=case)
