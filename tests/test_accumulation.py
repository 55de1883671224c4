"""Keras's gradient_accumulation_steps under ParameterServerStrategy: gradients stay in
the worker for N passes, travel once, and the weights are one process's on batches N
times the job's global batch."""

import re

import numpy as np
from harness import module_job


@module_job
def job(processes, _):
    # The servers log each tensor's traffic at DEBUG when they stop.
    got, output = processes.reports(2, "accumulation.py", BYTEPS_LOG_LEVEL="DEBUG")
    moved = {}
    for tensor, count in re.findall(r"server \d+ .*tensor '([^']+)' moved (\d+) bytes in",
                                    output):
        moved[tensor] = moved.get(tensor, 0) + int(count)
    return got, moved, output


def test_weights_match_one_process_on_accumulated_batches(job):
    got, _, _ = job
    for report in got.values():
        error = max(np.abs(np.array(mine) - np.array(theirs)).max()
                    for mine, theirs in zip(report["weights"], report["reference"], strict=True))
        assert error < 1e-5, error
        # Training moved the weights far more than that: applying nothing, or only
        # this worker's gradients, would not pass.
        assert report["initial_distance"] > 1e-3 and report["initial_distance"] > 100 * error
    np.testing.assert_array_equal(*(np.concatenate([np.ravel(w) for w in got[r]["weights"]])
                                    for r in (0, 1)))


def test_gradients_travel_once_per_accumulation(job):
    got, moved, output = job
    report = got[0]
    updates = report["reference_iterations"]
    per_round = len(got) * report["gradient_bytes"]  # every worker pushes every gradient
    accumulated = sum(count for tensor, count in moved.items() if "ReplicaAllReduce" in tensor)
    assert accumulated == updates * per_round, (moved, output)
    # Nothing else carried gradients each pass: the rest is the metrics and the initial
    # values (VariableInit), far less than one round of gradients per pass.
    rest = sum(count for tensor, count in moved.items()
               if "ReplicaAllReduce" not in tensor and not tensor.startswith("VariableInit."))
    assert rest < report["passes"] * per_round, moved


def test_iterations_count_updates_and_passes_as_keras_does(job):
    got, _, _ = job
    for report in got.values():
        # optimizer.iterations counts the updates (passes // N, as Keras reports them); the
        # variable underneath, which learning-rate schedules read, counts every pass.
        assert report["iterations"] == report["reference_iterations"] > 1
        assert report["passes_counted"] == report["passes"]
        assert report["passes"] == report["accumulate"] * report["iterations"]
