"""Elastic training's state, as Horovod's elastic scripts use it, through a real job:
sync, restore and commit (Horovod's test_elastic_state, in our words), the agreement on
host updates, and model.fit inside elastic.run with the elastic callbacks."""

import os
import signal
import time

import pytest
from harness import LAUNCH, base_env, finish, free_port, module_job, worker_command
from harness import marked_json as reports
from netbed import NetBed, NetBedUnavailable


@module_job
def job(processes, _):
    return processes.reports(2, "elastic_state.py")[0]


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


# The tests below that kill, freeze or cut off a process of an elastic_training.py job
# do it a second after every worker printed READY: at its step 20 or so, as the steps
# take at least their 0.05 s pause (the logs show steps 10 to 15). A job of 60 steps
# leaves at least 3 s for the loss to come, three times what it needs, and the steps
# after it still check every sum and count every step once.
STEPS_AROUND_A_LOSS = "60"


def _wait_until_ready(*workers) -> None:
    for worker in workers:
        for line in worker.stdout:
            if "READY" in line:
                break


def _resets(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("RESET")]


@pytest.mark.parametrize("merge,encrypt", [("0", "0"), ("1", "0"), ("0", "1")],
                         ids=["alone", "merged", "encrypted"])
def test_losing_rank_0_re_forms_the_job_with_the_survivors_renumbered(procs, merge, encrypt):
    # Horovod's "rank 0 killed" scenario: the survivors go on as a job of 2, the new
    # rank 0 is the oldest survivor, and every sum after the loss counts 2 workers
    # (elastic_training.py checks each one). Merged, the host's workers sum among
    # themselves first, with rank 0 leading some partitions when it dies. Encrypted,
    # the survivors and the server register again under fresh keys.
    job = procs.start_job_by_role(3, 1, "elastic_training.py", STEPS_AROUND_A_LOSS, "0.05",
                                  BYTEPS_ELASTIC=1, BYTEPS_LOCAL_MERGE=merge,
                                  BYTEPS_ENCRYPT=encrypt, BYTEPS_JOB_TOKEN="the job's secret")
    _wait_until_ready(job["worker0"], job["worker1"], job["worker2"])
    time.sleep(1.0)
    procs.end(job["worker0"])
    got = {}
    for name in ("worker1", "worker2"):
        status, output = finish(job[name], timeout=90)
        assert status == 0, output
        got[name] = output
        [report] = reports(output).values()
        assert report["size"] == 2 and report["step"] == 60, report
        assert report["sizes"] == [3, 2] and report["resets"] == [2], report
        # Every step counted once: restored to the last commit, then trained on.
        assert report["restores"] == 1 and report["weight"] == 60.0, report
    # Old rank 1 is the new rank 0, old rank 2 the new rank 1.
    assert _resets(got["worker1"])[0].startswith("RESET rank 0 size 2")
    assert _resets(got["worker2"])[0].startswith("RESET rank 1 size 2")
    status, output = finish(job["scheduler"], timeout=30)
    assert status == 0 and "re-formed as generation 1: 2 worker(s)" in output, output
    status, output = finish(job["server0"], timeout=30)
    assert status == 0, output


def test_a_frozen_worker_is_left_behind_after_the_heartbeat_timeout(procs):
    # SIGSTOP: its connections stay open, so only its silence tells. The survivors'
    # round waits for it until the scheduler gives up on it, then they re-form.
    job = procs.start_job_by_role(3, 1, "elastic_training.py", STEPS_AROUND_A_LOSS, "0.05",
                                  BYTEPS_ELASTIC=1, PS_HEARTBEAT_INTERVAL=0.5,
                                  PS_HEARTBEAT_TIMEOUT=3)
    _wait_until_ready(job["worker0"], job["worker1"], job["worker2"])
    time.sleep(1.0)
    os.kill(job["worker2"].pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    for name in ("worker0", "worker1"):
        status, output = finish(job[name], timeout=90)
        assert status == 0, output
        [report] = reports(output).values()
        assert report["sizes"] == [3, 2] and report["weight"] == 60.0, report
    assert time.monotonic() - frozen_at < 60
    status, output = finish(job["scheduler"], timeout=30)
    assert status == 0 and "worker rank 2" in output and "no heartbeat" in output, output


def test_a_worker_that_asks_to_join_is_taken_in_at_the_next_commit(procs):
    # 160 steps of at least 0.05 s: the newcomer starts TensorFlow (5 s and more on a
    # loaded 2-core machine) and asks in while the job is still well before its end
    # (with 100 steps, CI once saw it come in only after the last commit).
    job = procs.start_job_by_role(2, 1, "elastic_training.py", "160", "0.05", BYTEPS_ELASTIC=1)
    _wait_until_ready(job["worker0"], job["worker1"])
    newcomer = procs.start_worker("elastic_training.py", "160", "0.05")
    outputs = []
    for worker in (job["worker0"], job["worker1"], newcomer):
        status, output = finish(worker, timeout=90)
        assert status == 0, output
        outputs.append(output)
    old0, old1, new = (next(iter(reports(output).values())) for output in outputs)
    # The old workers were interrupted at one commit and went on as a job of 3, the
    # newcomer last in rank and synced to rank 0's state: all end alike.
    for report in (old0, old1):
        assert report["sizes"] == [2, 3] and report["resets"] == [3], report
    assert (old0["rank"], old1["rank"], new["rank"]) == (0, 1, 2)
    assert new["sizes"] == [3] and new["resets"] == []
    assert old0["weight"] == old1["weight"] == new["weight"] == 160.0
    interrupted = {line.split(" step ")[1] for output in outputs[:2] for line in _resets(output)}
    assert len(interrupted) == 1, outputs  # the same step on both


def test_a_worker_whose_link_is_cut_is_left_behind(procs):
    # Two hosts: the scheduler, the server and two workers on one, a third worker on the
    # other, whose link then goes down. No connection breaks and nothing is said: the
    # survivors' rounds wait until the scheduler finds that worker silent, and the job
    # re-forms without it.
    try:
        bed = NetBed(hosts=2).__enter__()
    except NetBedUnavailable as error:
        pytest.skip(str(error))
    try:
        procs.job_env = {"DMLC_PS_ROOT_URI": bed.address(0), "DMLC_PS_ROOT_PORT": free_port(),
                         "DMLC_NUM_WORKER": 3, "DMLC_NUM_SERVER": 1, "BYTEPS_ELASTIC": 1,
                         "PS_HEARTBEAT_INTERVAL": 0.5, "PS_HEARTBEAT_TIMEOUT": 3,
                         "BYTEPS_OP_TIMEOUT": 20}
        job = {}
        for name, host, role in (("scheduler", 0, "scheduler"), ("server", 0, "server")):
            job[name] = procs.start(bed.command(host, LAUNCH),
                                    base_env(DMLC_ROLE=role, **procs.job_env))
        for rank, host in enumerate((0, 0, 1)):
            job[f"worker{rank}"] = procs.start(
                bed.command(host, [*LAUNCH, *worker_command("elastic_training.py",
                                                            STEPS_AROUND_A_LOSS, "0.05")]),
                base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=rank, **procs.job_env))
        _wait_until_ready(job["worker0"], job["worker1"], job["worker2"])
        time.sleep(1.0)
        bed.cut(1)
        for name in ("worker0", "worker1"):
            status, output = finish(job[name], timeout=90)
            assert status == 0, output
            [report] = reports(output).values()
            assert report["sizes"] == [3, 2] and report["weight"] == 60.0, report
            assert report["restores"] == 1, report
        status, output = finish(job["scheduler"], timeout=30)
        assert status == 0 and "sent no heartbeat" in output, output
        assert "re-formed as generation 1: 2 worker(s)" in output, output
    finally:
        procs.end_all()
        bed.__exit__(None, None, None)


def test_too_few_survivors_end_the_job_naming_the_minimum(procs):
    # A failed elastic job's scheduler stays a heartbeat timeout to tell workers between
    # two registrations why: 3 s here instead of the default 10 s.
    job = procs.start_job_by_role(2, 1, "elastic_training.py", "1000", "0.05", BYTEPS_ELASTIC=1,
                                  BYTEPS_ELASTIC_MIN_WORKERS=2, BYTEPS_ELASTIC_TIMEOUT=3,
                                  PS_HEARTBEAT_INTERVAL=0.5, PS_HEARTBEAT_TIMEOUT=3)
    _wait_until_ready(job["worker0"], job["worker1"])
    procs.end(job["worker1"])
    status, output = finish(job["scheduler"], timeout=60)
    assert status == 1, output
    assert "BYTEPS_ELASTIC_MIN_WORKERS=2" in output and "1 worker(s)" in output, output
    status, output = finish(job["worker0"], timeout=60)
    assert status != 0 and "BYTEPS_ELASTIC_MIN_WORKERS=2" in output, output
    status, output = finish(job["server0"], timeout=60)
    assert status == 1, output



def _fit_through_a_loss(procs, workers: int, servers: int, victim: str, **env):
    """elastic_fit.py in an elastic job whose `victim` is killed once epoch 1 begins:
    the job's processes, and the reports of workers 0 and 1, which must finish."""
    job = procs.start_job_by_role(workers, servers, "elastic_fit.py", BYTEPS_ELASTIC=1, **env)
    for line in job["worker0"].stdout:
        if line.startswith("EPOCH 1"):
            break
    procs.end(job[victim])
    got = {}
    for name in ("worker0", "worker1"):
        status, output = finish(job[name], timeout=120)
        assert status == 0, output
        got.update(reports(output))
    return job, got


@pytest.mark.parametrize("strategy", ["", "1"])
def test_model_fit_inside_elastic_run_survives_a_lost_worker(procs, strategy):
    _, got = _fit_through_a_loss(procs, 3, 1, "worker2", ELASTIC_FIT_STRATEGY=strategy)
    assert sorted(got) == [0, 1]
    for report in got.values():
        # Trained on as a job of 2, each worker taking half of the global batch (the
        # strategy: a replica per worker, counted anew).
        shapes = [[3, 3, 20], [2, 2, 20]] if strategy else [[3, 8, 20], [2, 12, 20]]
        assert report["shapes"] == shapes, report
        assert report["epoch"] == 4, report
        assert report["loss"] < 0.5, report
    assert got[0]["weights"] == got[1]["weights"]


def test_suspend_and_resume_as_in_byteps(procs):
    job = procs.start_job_by_role(3, 1, "suspend_resume.py", BYTEPS_ELASTIC=1,
                                  PS_HEARTBEAT_INTERVAL=0.5, PS_HEARTBEAT_TIMEOUT=3)
    got = {}
    for name in ("worker0", "worker1", "worker2"):
        status, output = finish(job[name], timeout=90)
        assert status == 0, output
        got.update(reports(output))
    assert sorted(got) == [0, 1], got
    for report in got.values():
        assert report["before"] == 3.0 and report["after"] == 2.0 and report["size"] == 2
    assert got[0]["told"] == ""
    assert "re-formed as 2 worker(s) and 1 server(s)" in got[1]["told"], got[1]
    status, output = finish(job["scheduler"], timeout=30)
    assert status == 0, output


def test_a_server_lost_at_any_moment_inside_elastic_run(procs):
    # Killed whenever it happens to be: its keys go to the other server and the job
    # goes on in its generation. Usually nothing is restored; if the server had
    # answered a round to one worker and not to the other, that round cannot be
    # finished elsewhere, and elastic.run restores the last commit instead (one
    # re-forming). Either way every sum is right and the weight counts every step.
    job = procs.start_job_by_role(2, 2, "elastic_training.py", STEPS_AROUND_A_LOSS, "0.05",
                                  BYTEPS_ELASTIC=1, PS_HEARTBEAT_INTERVAL=0.5,
                                  PS_HEARTBEAT_TIMEOUT=3)
    _wait_until_ready(job["worker0"], job["worker1"])
    time.sleep(1.0)
    procs.end(job["server1"])
    resets = set()
    for name in ("worker0", "worker1"):
        status, output = finish(job[name], timeout=90)
        assert status == 0, output
        [report] = reports(output).values()
        assert report["sizes"] == [2] and report["weight"] == 60.0, report
        resets.add(tuple(report["resets"]))
    assert resets in ({()}, {(2,)}), resets
    status, output = finish(job["scheduler"], timeout=30)
    assert status == 0 and "the job goes on without server" in output, output


def test_losing_the_last_server_ends_the_job_naming_it(procs):
    job = procs.start_job_by_role(2, 1, "elastic_training.py", "1000", "0.05", BYTEPS_ELASTIC=1,
                                  PS_HEARTBEAT_INTERVAL=0.5, PS_HEARTBEAT_TIMEOUT=3)
    _wait_until_ready(job["worker0"], job["worker1"])
    procs.end(job["server0"])
    status, output = finish(job["scheduler"], timeout=60)
    assert status == 1 and "it was the job's last server" in output, output
    for name in ("worker0", "worker1"):
        status, output = finish(job[name], timeout=60)
        assert status != 0 and "last server" in output, output


def test_a_server_that_asks_to_join_takes_its_share_at_the_next_commit(procs):
    # The server, a native program started right after the workers are READY, registers
    # within a second: the 3 s of a 60-step job leave it three times that.
    job = procs.start_job_by_role(2, 1, "elastic_training.py", STEPS_AROUND_A_LOSS, "0.05",
                                  BYTEPS_ELASTIC=1)
    _wait_until_ready(job["worker0"], job["worker1"])
    extra = procs.start(LAUNCH, base_env(DMLC_ROLE="server", **procs.job_env))
    for name in ("worker0", "worker1"):
        status, output = finish(job[name], timeout=90)
        assert status == 0, output
        [report] = reports(output).values()
        assert report["sizes"] == [2] and report["weight"] == 60.0, report
    status, output = finish(job["scheduler"], timeout=30)
    assert status == 0 and "re-formed as generation 1: 2 worker(s), 2 server(s)" in output, output
    status, output = finish(extra, timeout=30)
    assert status == 0, output


def test_asynchronous_training_survives_a_lost_server(procs):
    # The servers hold the parameters here: the job re-forms on the other server, whose
    # store is seeded again with rank 0's parameters (not with its next delta), and
    # training goes on from where it was.
    job, got = _fit_through_a_loss(procs, 2, 2, "server1", BYTEPS_ENABLE_ASYNC=1)
    for report in got.values():
        assert report["shapes"] == [[2, 12, 20], [2, 12, 20]], report
        assert report["epoch"] == 4, report
        # Nothing learned was lost at the re-form: each epoch of the fit after it began
        # with a lower loss than the one before (servers seeded with a delta would send
        # it back near the start).
        losses = report["epoch_losses"][-1]
        assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), report
        assert report["loss"] < 0.05 * report["initial_loss"], report
    status, output = finish(job["scheduler"], timeout=30)
    assert status == 0 and "re-formed as generation 1: 2 worker(s), 1 server(s)" in output, output


@pytest.mark.parametrize("fault,merge", [("killed", "0"), ("frozen", "0"), ("killed", "1")])
def test_a_lost_server_costs_no_step_in_synchronous_training(procs, fault, merge):
    # The last rank pauses before step 8, so the other's rounds of that step wait at
    # every server when one is lost: killed (the workers' connections break and they
    # say so) or frozen (its heartbeats stop). The workers send what waited there to
    # the servers left, which finish those rounds: no elastic.run, no restore, no new
    # generation, every sum of every step right. Merged, the host's sums wait at the
    # merge instead, and go to the servers left once the last rank comes.
    job = procs.start_job_by_role(2, 3, "server_loss.py", "16", "8", "4", BYTEPS_ELASTIC=1,
                                  BYTEPS_PARTITION_BYTES=65536, PS_HEARTBEAT_INTERVAL=0.5,
                                  PS_HEARTBEAT_TIMEOUT=2, BYTEPS_LOCAL_MERGE=merge)
    for line in job["worker1"].stdout:
        if line.startswith("PAUSING"):
            break
    time.sleep(0.5)  # worker 0's pushes of step 8 are at the servers by now
    lost_at = time.monotonic()
    if fault == "killed":
        procs.end(job["server1"])
    else:
        os.killpg(job["server1"].pid, signal.SIGSTOP)
    moved = 0
    for name in ("worker0", "worker1"):
        status, output = finish(job[name], timeout=60)
        assert status == 0, output
        [report] = reports(output).values()
        assert report["checked"] == 16 * 3 + 6, report
        assert "is gone from the job" in output, output
        moved += sum(int(line.split("(")[-1].split()[0]) for line in output.splitlines()
                     if "is gone from the job" in line)
    if merge == "0":
        assert moved > 0  # worker 0's partitions of step 8 at the lost server, again
    assert time.monotonic() - lost_at < 4 + 5  # the pause, then at most a heartbeat timeout
    status, output = finish(job["scheduler"], timeout=30)
    assert status == 0 and "the job goes on without server" in output, output
    assert "re-form" not in output, output
