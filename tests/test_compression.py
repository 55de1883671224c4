"""Gradient compression through real jobs: PowerSGD's low-rank factors step by step
against a numpy model of its definition, through the tape and under the strategy."""

from conftest import marked_json as reports


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
        # Under ParameterServerStrategy in model.fit: 4 SGD steps of a linear layer as the
        # model computes them (the first whole), the state kept by the gradient's place.
        strategy = report["strategy"]
        assert strategy["worst"] < 1e-5, strategy
        assert strategy["keys"] == ["StrategyGradient.0.36x4"], strategy
    assert got[0]["strategy"]["weights"] == got[1]["strategy"]["weights"]
    # ... and with Compression.fp16: float16's rounding of the gradients, and no more.
    for report in got.values():
        assert 1e-6 < report["fp16"]["worst"] < 1e-3, report["fp16"]  # float32: ~1e-8
    assert got[0]["fp16"]["weights"] == got[1]["fp16"]["weights"]


# Training with PowerSGD to the accuracy of whole gradients: test_examples.py runs the
# DistributedOptimizer example with --powersgd-rank 4.
