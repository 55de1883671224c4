"""Gradient compression through real jobs: PowerSGD's low-rank factors step by step
against a numpy model of its definition, through the tape and under the strategy; the
core's compressors (BytePS's) on both legs of push_pull against a model of theirs."""

import re

from harness import marked_json as reports


def server_traffic(output: str) -> dict[str, tuple[int, int]]:
    """Bytes (in, out) per tensor, summed over the servers' lines at their end."""
    moved: dict[str, tuple[int, int]] = {}
    for name, bytes_in, bytes_out in re.findall(
            r"tensor '([^']+)' [^\n]*?moved (\d+) bytes in and (\d+) bytes out", output):
        was_in, was_out = moved.get(name, (0, 0))
        moved[name] = (was_in + int(bytes_in), was_out + int(bytes_out))
    return moved


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
        # model computes them (the first whole), the state kept under the gradient's
        # name in the step's graph, the same in every fit.
        strategy = report["strategy"]
        assert strategy["worst"] < 1e-5, strategy
        assert len(strategy["keys"]) == 1 and strategy["keys"][0].endswith("PushPull"), strategy
    assert got[0]["strategy"]["weights"] == got[1]["strategy"]["weights"]
    # ... and with Compression.fp16: float16's rounding of the gradients, and no more.
    for report in got.values():
        assert 1e-6 < report["fp16"]["worst"] < 1e-3, report["fp16"]  # float32: ~1e-8
    assert got[0]["fp16"]["weights"] == got[1]["fp16"]["weights"]


# Training with PowerSGD to the accuracy of whole gradients: test_examples.py runs the
# DistributedOptimizer example with --powersgd-rank 4.


# BytePS's compressors in the core (custom_ops/compression): every round of a
# push_pull against a numpy model of both legs, partition by partition
# (tests/workers/core_compression.py). Partitions of 64 KB cut each 200 KB tensor in
# four, spread over the servers.
CORE = {"BYTEPS_PARTITION_BYTES": "65536", "BYTEPS_LOG_LEVEL": "INFO"}


def _core_compression_job(procs, workers: int, servers: int, **env) -> dict:
    status, output = procs.launch(workers, "core_compression.py", num_servers=servers,
                                  **CORE, **env)
    assert status == 0, output
    got = reports(output)
    assert sorted(got) == list(range(workers)), output
    for report in got.values():
        # The result is the model's: each worker's compressed push (with momentum and
        # error feedback), the server's sum compressed again with its own feedback.
        assert all(worst <= 1e-5 for worst in report["worst"].values()), report["worst"]
        # ... which is far from the plain mean, so the model is what the check tells.
        assert min(report["from_mean"].values()) > 0.5, report["from_mean"]
        # Below BYTEPS_MIN_COMPRESS_BYTES: whole (the mean, up to its rounding).
        assert report["small"] < 1e-5, report["small"]
    # The servers counted the bytes each tensor moved: exactly the compressed sizes, in
    # from every sender and out to each of them.
    moved = server_traffic(output)
    report = got[0]
    for name, compressed in report["wire_bytes"].items():
        senders = report["senders"]
        assert moved[name] == (senders * compressed, senders * compressed), (name, moved[name])
    return report


def test_core_compressors_on_both_legs_match_their_model(procs):
    report = _core_compression_job(procs, 2, 2)
    assert report["specs"]["randomk"] == "randomk k=0.05 ef=vanilla momentum=none seed=3"
    assert all(worst == 0.0 for worst in report["worst"].values()), report["worst"]
    # The learning rate fell to a quarter before the last round
    # (bps.set_compression_learning_rate): the residuals were rescaled by 4, which the
    # model without rescaling tells apart.
    assert min(report["from_unscaled"].values()) > 0.1, report["from_unscaled"]
    assert "'topk k=0.05 ef=vanilla momentum=none' compresses float32 tensors, not float64" in (
        report["refusals"]["float64"])
    assert "compresses sums and averages, not max" in report["refusals"]["max"]


def test_core_compression_with_three_workers_sums_what_they_sent(procs):
    # Small integers: every sum is exact, so the order the server adds pushes in cannot
    # matter; the results differ from the model only by the average's rounding.
    _core_compression_job(procs, 3, 1, INTEGERS="1", COMPRESSORS="topk,randomk,dithering",
                          MODES="eager")


def test_core_compression_after_the_local_merge(procs):
    # Forced local merge on one host: the host's sum is compressed once, by the worker
    # leading each partition, and its result shared with the other.
    _core_compression_job(procs, 2, 1, MERGED="1", BYTEPS_LOCAL_MERGE="1",
                          COMPRESSORS="onebit,topk,nesterov", MODES="graph")
