"""DistributedOptimizer details, Keras callbacks, sparse gradients and saving."""

import json
import sys

import numpy as np
import pytest
from harness import base_env, module_job


def _two_worker_job(processes, tmp_path_factory, script: str):
    """`script` on 2 workers, given a folder of its own: (each rank's REPORT, folder)."""
    out = tmp_path_factory.mktemp(script.removesuffix(".py"))
    return processes.reports(2, script, str(out))[0], out


@module_job
def job(processes, tmp_path_factory):
    return _two_worker_job(processes, tmp_path_factory, "keras_features.py")


def test_optimizer_applies_only_the_average_and_keeps_its_identity(job):
    got, _ = job
    for report in got.values():
        assert report["applied"] == [-1.5, -1.5, -1.5]  # SGD(1.0) step of mean(1, 2)
        assert report["class"] == ["SGD", "keras.src.optimizers.sgd"]
        assert report["config_matches"]


def test_broadcast_callback_starts_everyone_from_rank_0(job):
    got, _ = job
    assert got[0]["initial_weights"] != got[1]["initial_weights"]
    assert got[0]["first_weights"] == got[1]["first_weights"] == got[0]["initial_weights"]
    assert got[0]["final_weights"] == got[1]["final_weights"]


def test_metric_average_callback_gives_the_cross_worker_mean(job):
    got, _ = job
    for epoch in range(3):
        local = [got[r]["local_logs"][epoch] for r in (0, 1)]
        assert local[0]["loss"] != local[1]["loss"]
        for rank in (0, 1):
            averaged = got[rank]["averaged_logs"][epoch]
            for key in ("loss", "mae"):
                assert averaged[key] == pytest.approx((local[0][key] + local[1][key]) / 2)


def test_learning_rate_warmup_and_schedule(job):
    got, _ = job
    steps, warmup, size, initial = 4, 2, 2, 0.1
    expected = []
    for epoch in range(3):
        for batch in range(steps):
            if epoch < warmup:
                progress = epoch + batch / steps + 1 / steps
                expected.append(initial / size * (progress * (size - 1) / warmup + 1))
            else:
                expected.append(expected[-1])
    for report in got.values():
        np.testing.assert_allclose(report["rates"], expected, rtol=1e-6)
        assert report["rates"][-1] == pytest.approx(initial)
        # Staircase, epochs 1 and 2 only, two batches per epoch.
        np.testing.assert_allclose(report["schedule_rates"],
                                   [0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025], rtol=1e-6)


def test_momentum_correction_rescales_momentum_with_the_rate(job):
    got, _ = job
    for report in got.values():
        assert report["momentum_corrected"] == [0.5, -1.0]


def test_sparse_gradients_allgather_and_legacy_optimizer(job):
    got, _ = job
    dense = [[0.5, 0.5], [1.0, 1.0], [0.5, 0.5], [1.0, 1.0], [0.0, 0.0], [1.5, 1.5]]
    for report in got.values():
        assert report["sparse_False"] == ["IndexedSlices", dense]
        assert report["sparse_True"][1] == dense and report["sparse_True"][0] != "IndexedSlices"
        assert report["allgather"] == [[0, 0], [1, 1], [1, 1]]
        assert report["legacy"] == [-1.5, -1.5]


def test_saved_model_reloads_without_tf_bps(job, procs):
    got, out = job
    probe = (
        "import json, sys, keras\n"
        f"model = keras.models.load_model({str(out / 'model.keras')!r})\n"
        "print('tf_bps' in sys.modules, type(model.optimizer).__module__,\n"
        "      json.dumps([w.numpy().tolist() for w in model.weights]))\n")
    status, output = procs.run([sys.executable, "-c", probe], base_env())
    assert status == 0, output
    loaded, module, weights = output.strip().splitlines()[-1].split(" ", 2)
    assert loaded == "False" and module == "keras.src.optimizers.sgd"
    assert json.loads(weights) == got[0]["saved_weights"] == got[1]["saved_weights"]


@module_job
def layers_job(processes, tmp_path_factory):
    """tests/workers/horovod_layers.py: each figure is the largest difference from one
    process computing the same on the global batch."""
    return _two_worker_job(processes, tmp_path_factory, "horovod_layers.py")


def test_sync_batch_normalization_uses_the_global_batch(layers_job):
    got, out = layers_job
    for report in got.values():
        for mode in ("loop_eager", "loop_function"):
            figures = report[mode]
            assert figures["outputs"] < 1e-5 and figures["grads"] < 1e-5, figures
            assert figures["moving"] < 1e-6, figures
            assert figures["unsynced_outputs"] > 0.1, figures  # the check can tell
        assert report["fit_optimizer"] < 1e-5
        assert report["loaded_layer"] == "SyncBatchNormalization"


def test_synchronized_batch_normalization_under_the_strategy(layers_job):
    got, out = layers_job
    for report in got.values():
        assert report["keras_synchronized"] < 1e-5
        assert report["strategy_sync_layer"] < 1e-5
    # BestModelCheckpoint under the strategy: rank 0 wrote the one file.
    assert (out / "keras_synchronized.keras").exists()
    for report in got.values():
        assert "rank 0: model.save to" in report["mixed_saves"]
        assert "rank 1: model.save_weights to" in report["mixed_saves"]
    assert not list(out.glob("mixed*"))


def test_best_model_checkpoint_saves_improvements_on_rank_0(layers_job):
    got, out = layers_job
    # The monitored scores were 3, 1, 2, 0.5: epochs 1, 2 and 4 improved.
    assert sorted(p.name for p in out.glob("best-*")) == [
        "best-r0-1.keras", "best-r0-2.keras", "best-r0-4.keras"]
    for report in got.values():
        assert "filepath" in report["best_without_path"]


def test_local_layers_keep_their_gradients(layers_job):
    got, _ = layers_job
    for report in got.values():
        assert report["partial_tape"] < 1e-6
        assert report["split"] == [["local/kernel", "local/bias"],
                                   ["shared/kernel", "shared/bias"]]
        assert report["split_gradients"] < 1e-6
    first, second = (got[r]["partial_optimizer"] for r in (0, 1))
    assert first["shared"] == second["shared"]  # averaged, from rank 0's start
    assert first["local"] != second["local"]  # each worker's own gradient
    # Each worker began from its own initial values (seeded by rank); the broadcast at
    # the start gave everyone rank 0's shared layer and skipped the local one.
    assert first["initial"][0] != second["initial"][0]
    for report in (first, second):
        assert report["start"][0] == first["initial"][0]
        assert report["start"][1] == report["initial"][1]
