"""Elastic training's state, as Horovod's elastic scripts use it, through a real job:
sync, restore and commit (Horovod's test_elastic_state, in our words), the agreement on
host updates, and model.fit inside elastic.run with the elastic callbacks."""

import time

import pytest
from conftest import finish
from conftest import marked_json as reports


@pytest.fixture(scope="module")
def job():
    from conftest import Processes

    processes = Processes()
    try:
        status, output = processes.launch(2, "elastic_state.py")
    finally:
        processes.end_all()
    assert status == 0, output
    got = reports(output)
    assert sorted(got) == [0, 1], output
    return got


ONES = [[[1.0, 1.0], [1.0, 1.0]], [1.0, 1.0]]
CHANGED = [[[1.0, 2.0], [3.0, 4.0]], [0.0, 0.0]]


def test_sync_restore_and_commit_of_tensorflow_variables(job):
    for report in job.values():
        # sync: every worker takes rank 0's values and attributes.
        assert report["tf_synced"] == {"values": ONES, "batch": 20, "epoch": 10}
        # restore: what was not committed is undone.
        assert report["tf_restored"] == {"values": ONES, "batch": 20, "epoch": 10}
        # commit, then restore: the committed values stay.
        assert report["tf_committed"] == {"values": CHANGED, "batch": 21, "epoch": 11}


def test_sync_restore_and_commit_of_a_keras_model(job):
    for report in job.values():
        assert report["keras_synced"] == [ONES, 20, 10]
        assert report["keras_restored"] == [ONES, 20, 10]
        assert report["keras_committed"] == [CHANGED, 21, 11]


def test_a_host_update_heard_by_rank_0_interrupts_every_worker_at_one_commit(job):
    # Removals only: the survivors agree already, so no sync; an addition needs one.
    for report in job.values():
        assert report["interrupts"] == ["skip_sync", "sync", "none"]


def test_fit_inside_elastic_run_keeps_the_state_and_commits(job):
    for report in job.values():
        assert report["run"] == "done"
        assert report["fit_state"] == [3, 0]  # three epochs done, at no batch of a fourth
        assert report["resets"] == 0
        # 4 batches an epoch: a commit after batches 2 and 4 (index 1 and 3), and at
        # each epoch's end, which the epoch callback counted first.
        assert report["commits"] == [[0, 1], [0, 3], [1, 0], [1, 1], [1, 3], [2, 0],
                                     [2, 1], [2, 3], [3, 0]]
    assert job[0]["net_weights"] == job[1]["net_weights"]


def test_a_lost_worker_ends_run_with_the_internal_error_after_restoring(procs):
    job = procs.start_job_by_role(3, 1, "elastic_loop.py")
    for rank in range(3):
        for line in job[f"worker{rank}"].stdout:
            if "READY" in line:
                break
    time.sleep(1.0)
    procs.end(job["worker1"])
    for rank in (0, 2):
        status, output = finish(job[f"worker{rank}"], timeout=30)
        assert status == 3, output
        report = reports(output)[rank]
        # The broken collective became the internal error, the state went back to the
        # last commit, and the job, whose workers are fixed, ends naming the failure.
        assert report["cause"] == "InternalError", report
        assert "worker rank 1" in report["error"] and "cannot re-form" in report["error"]
        assert report["step"] >= 5 and report["step"] % 5 == 0, report
        assert report["counter"] == report["step"], report
