"""Tensors in device memory through the core's C API, with no TensorFlow: every
collective, checked against numpy in each worker (tests/workers/device_collectives.py).
On this machine host memory stands in for the device (the core's host table), so the
staging pipeline runs through real scheduler, server and worker processes: pinned
pieces, partitions held until their piece is on the host, answers copied back, the
caller's stream waiting at the end. On a GPU machine with CuPy the same script runs on
CUDA memory (tools/gpu_check.sh runs it there); here that test skips."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness import marked_json

ROOT = Path(__file__).resolve().parent.parent

CASES = 53  # the checks device_collectives.py makes


def _all_checked(status: int, output: str, workers: int, memory: str) -> None:
    assert status == 0, output
    reports = marked_json(output)
    assert sorted(reports) == list(range(workers)), output
    for report in reports.values():
        assert report["memory"] == memory, report
        cases = CASES + (memory == "cuda")  # and the caller's stream going on meanwhile
        assert report["failures"] == [] and report["checked"] == cases, report


@pytest.mark.parametrize("merge,devices,merged_where", [
    ("0", "shared", None),
    # Both workers on stand-in device 0: the collectives cannot serve them (as NCCL
    # refuses two ranks on one GPU), so the host's workers sum on the host.
    ("1", "shared", "merge on the host: worker ranks 0 and 1 share one device "
                    "(host stand-in device 0)"),
    # A device each: each partition is summed onto its leader's device, pushed from
    # there, and broadcast from it (the stand-in's collectives in place of NCCL's).
    ("1", "per_worker", "merge on their devices (host stand-in collectives)"),
])
def test_every_collective_on_device_memory_through_real_servers(procs, merge, devices,
                                                                merged_where):
    # Partitions of 64 KiB: a 1.2 MB tensor is 19 pieces, copied and pushed in turn.
    status, output = procs.launch(
        2, "device_collectives.py", num_servers=2, timeout=120, DEVICE_MEMORY="standin",
        STANDIN_DEVICES=devices, BYTEPS_PARTITION_BYTES=65536, BYTEPS_LOCAL_MERGE=merge,
        BYTEPS_LOG_LEVEL="DEBUG")
    _all_checked(status, output, 2, "standin")
    assert "staged through the host stand-in table" in output, output
    if merged_where:
        assert f"device tensors of worker ranks 0, 1 {merged_where}" in output, output


def test_one_worker_without_servers_copies_on_the_device(procs):
    status, output = procs.launch(1, "device_collectives.py", timeout=60,
                                  DEVICE_MEMORY="standin")
    _all_checked(status, output, 1, "standin")


def _gpus() -> int:
    if importlib.util.find_spec("cupy") is None:
        return 0
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                              timeout=30).stdout.count("GPU ")
    except (OSError, subprocess.TimeoutExpired):
        return 0


@pytest.mark.skipif(_gpus() == 0, reason="no GPU with CuPy here (tools/gpu_check.sh runs this "
                                         "on GPU machines)")
def test_every_collective_on_a_gpu(procs):
    # The host's two workers merge: with NCCL on GPUs of their own, else (one GPU, which
    # NCCL will not share) on the host.
    status, output = procs.launch(2, "device_collectives.py", num_servers=2, timeout=300,
                                  DEVICE_MEMORY="cuda", BYTEPS_PARTITION_BYTES=262144,
                                  BYTEPS_LOCAL_MERGE=1)
    _all_checked(status, output, 2, "cuda")
    merged = ("merge on their devices (CUDA collectives)" if _gpus() > 1
              else "merge on the host: worker ranks 0 and 1 share one device")
    if "NCCL cannot be loaded" not in output:  # else the log says so, and they merge on the host
        assert f"device tensors of worker ranks 0, 1 {merged}" in output, output


def test_a_nan_in_a_late_piece_fails_every_worker_at_once(procs):
    # 64 KiB partitions: the NaN is in a piece copied after the first ones were pushed.
    status, output = procs.launch(
        2, "device_nan.py", num_servers=1, timeout=90, BYTEPS_OP_TIMEOUT=60,
        BYTEPS_PARTITION_BYTES=65536, PERSEUS_ALLREDUCE_NANCHECK=1)
    assert status == 0, output
    reports = marked_json(output)
    assert "tensor 'nan_probe' holds NaN or Inf on worker rank 1 at step 1" in \
        reports[1]["nan"], reports
    assert "worker rank 1 gave up round 1 of tensor 'nan_probe'" in reports[0]["nan"], reports
    assert max(r["seconds"] for r in reports.values()) < 20, reports
    assert reports[0]["clean"] == reports[1]["clean"] == 2000.0, reports


def test_asynchronous_push_pull_of_device_memory(procs):
    status, output = procs.launch(2, "device_async.py", num_servers=2, timeout=90,
                                  BYTEPS_ENABLE_ASYNC=1, BYTEPS_PARTITION_BYTES=65536)
    assert status == 0, output
    reports = marked_json(output)
    assert sorted(reports) == [0, 1], output
    # Rank 0's first value is what the servers keep; rank 1 may see rank 0's delta
    # (10) on it already. Each later answer holds the worker's own delta and, in each
    # partition, the other's if that reached the partition's server first.
    assert reports[0]["first"] == [1.0], reports
    assert set(reports[1]["first"]) <= {1.0, 11.0}, reports
    for rank, report in reports.items():
        assert set(report["second"]) <= {1.0 + 10.0 * (rank + 1), 31.0}, report


def test_the_device_merge_refuses_what_it_cannot_sum_alike(procs):
    status, output = procs.launch(
        2, "device_merge_faults.py", num_servers=1, timeout=90, BYTEPS_OP_TIMEOUT=4,
        BYTEPS_PARTITION_BYTES=65536, BYTEPS_LOCAL_MERGE=1)
    assert status == 0, output
    reports = marked_json(output)
    for report in reports.values():
        assert ("worker ranks 0 and 1 of this host disagree on tensor 'sized' (round 1)"
                in report["mismatch"]), reports
        assert report["clean"] == 20.0, reports
    assert ("worker rank(s) 1 of this host did not reach tensor 'lonely' (round 1) within 4 s"
            in reports[0]["lonely"]), reports
    assert reports[0]["lonely_seconds"] < 10, reports


def test_the_timeline_says_how_much_of_the_device_copies_the_network_hid(procs, tmp_path):
    # tools/gpu_check.sh reads its copy-overlap figure from such a recording on a GPU.
    status, output = procs.launch(
        2, "device_collectives.py", num_servers=2, timeout=120, DEVICE_MEMORY="standin",
        BENCH_MB="1,4", BYTEPS_PARTITION_BYTES=1048576, BENCH_TRACE_DIR=tmp_path)
    _all_checked(status, output, 2, "standin")
    for tensor in ("bench1", "bench4"):  # each size its own recording, as gpu_check reads
        overlap = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "copy_overlap.py"), str(tmp_path), tensor],
            capture_output=True, text=True, timeout=60, check=True)
        figure = json.loads(overlap.stdout)
        assert figure["copy_ms"] > 0 and 0 <= figure["hidden"] <= 1, (tensor, figure)
