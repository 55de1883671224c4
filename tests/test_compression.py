"""Gradient compression through real jobs: PowerSGD's low-rank factors step by step
against a numpy model of its definition, and training to the accuracy of whole
gradients."""

import re

from conftest import marked_json as reports
from test_examples import run_example


def test_powersgd_matches_its_definition_step_by_step(procs):
    # 2 workers, one 36x4 matrix, a vector and a matrix too small to gain: step 1 whole
    # (start_iter), steps 2-4 as rank-2 factors with warm start and error feedback.
    status, output = procs.launch(2, "powersgd.py")
    assert status == 0, output
    got = reports(output)
    assert sorted(got) == [0, 1], output
    for report in got.values():
        assert report["compresses"] == ["DistributedGradientTape.0.kernel:0"]
        worst = report["worst"]
        assert worst["whole_step"] < 1e-6 and worst["others"] < 1e-6, worst
        assert worst["kernel"] < 1e-5, worst
        # The factors are an approximation: the check could tell them from the mean.
        assert min(report["differs_from_mean"]) > 0.1, report
        assert "gradient_predivide_factor=2.0" in report["predivide"]


def test_powersgd_trains_as_well_as_whole_gradients(procs):
    # The README's DistributedOptimizer example on real digits; whole gradients reach
    # above 0.9 there (test_examples.py).
    output = run_example(procs, "keras_mnist_distributed_optimizer.py", "--powersgd-rank",
                         "4", workers=2)
    found = re.search(r"test accuracy ([\d.]+)", output)
    assert found and float(found.group(1)) > 0.9, output
