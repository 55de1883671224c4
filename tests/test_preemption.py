"""Preemption notices (SIGTERM, as spot machines and Kubernetes pod deletions send): in an
elastic job the worker finishes its step, leaves at the next commit and exits 0, and the
others go on without a restore or a lost step; in a job that cannot re-form, the signal
ends every process within seconds, and the launcher names it. Both through bpslaunch and
under a cluster manager's start (mpirun)."""

import os
import re
import shutil
import signal
import time

import pytest
from harness import (
    LAUNCH,
    base_env,
    descendants,
    finish,
    marked_json,
    runs,
    scrape,
    wait_for_line,
    worker_command,
)


def test_an_elastic_worker_told_to_stop_leaves_at_its_next_commit_and_exits_0(procs):
    job = procs.start_job_by_role(3, 1, "elastic_training.py", "200", "0.05",
                                  BYTEPS_ELASTIC=1, BYTEPS_ELASTIC_MIN_WORKERS=2,
                                  BYTEPS_METRICS_PORT=0)
    metrics = int(wait_for_line(job["scheduler"], r"scheduler metrics at http://[^:]+:(\d+)/")
                  .group(1))
    pids = [int(wait_for_line(job[f"worker{rank}"], r"READY rank \d+ pid (\d+)").group(1))
            for rank in range(3)]
    wait_for_line(job["worker2"], r"COMMIT rank \d+ step 10\b")  # training, past a commit
    os.kill(pids[2], signal.SIGTERM)
    noticed = time.monotonic()
    status, output = finish(job["worker2"], timeout=60)
    left_after = time.monotonic() - noticed
    assert status == 0, output
    assert "received SIGTERM" in output and "leaves the job after SIGTERM" in output, output
    left = re.search(r"PREEMPTED rank 2 step (\d+) weight ([\d.]+)", output)
    assert left, output
    assert left_after < 30, output  # within a grace period (the next commit: every 5 steps)
    # The scheduler's endpoint counts the re-form; its figures outlive generations.
    scheduler = scrape(metrics)
    assert scheduler[("tf_bps_scheduler_generation",)] == 1, scheduler
    assert scheduler[("tf_bps_scheduler_reforms_total",)] == 1, scheduler
    assert scheduler[("tf_bps_scheduler_workers",)] == 2, scheduler
    left_step = int(left.group(1))
    assert float(left.group(2)) == left_step  # the hook saw the committed state
    for rank in (0, 1):
        status, output = finish(job[f"worker{rank}"], timeout=90)
        assert status == 0, output
        [report] = marked_json(output).values()
        # Re-formed once without the leaver, with no restore and no sync: no step lost.
        assert report["sizes"] == [3, 2] and report["resets"] == [2], report
        assert report["restores"] == 0 and report["syncs"] == 1, report  # the first one
        assert report["weight"] == 200.0 and report["step"] == 200, report
        resets = [line for line in output.splitlines() if line.startswith("RESET")]
        assert resets == [f"RESET rank {rank} size 2 step {left_step}"], output
    status, output = finish(job["scheduler"], timeout=30)
    assert status == 0 and "told to stop ('SIGTERM')" in output, output


def test_sigterm_to_a_worker_of_a_job_that_cannot_re_form_ends_it_naming_the_signal(procs):
    launcher = procs.start([*LAUNCH, "-np", "2", *worker_command("loop.py")], base_env())
    wait_for_line(launcher, "READY")
    wait_for_line(launcher, "READY")
    everyone = descendants(launcher.pid)  # the scheduler, the servers and the workers
    workers = [child for child in everyone if "loop.py" in open(f"/proc/{child}/cmdline").read()]
    assert len(workers) == 2, everyone
    os.kill(workers[1], signal.SIGTERM)
    noticed = time.monotonic()
    status, output = finish(launcher, timeout=30)
    assert time.monotonic() - noticed < 10, output
    assert status == 128 + signal.SIGTERM, output
    assert re.search(r"worker \d failed with status 143 \(SIGTERM\); ending the job", output), \
        output
    for pid in everyone:
        assert not os.path.exists(f"/proc/{pid}"), f"process {pid} still runs:\n{output}"


def _mpirun(procs, count: int, script: str, *args: str, **env):
    """A job of `count` ranks under a real mpirun (Debian's Open MPI), each process finding
    its place from Open MPI's variables (cluster_env.py): (mpirun, its tree's PIDs once
    every rank printed READY, the rank processes by rank)."""
    if not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (apt-get install openmpi-bin)")
    forwarded = [flag for name in env for flag in ("-x", name)]
    mpirun = procs.start(["mpirun", "-np", str(count), "--oversubscribe", "--bind-to", "none",
                          "--tag-output", *forwarded, *worker_command(script, *args)],
                         base_env(OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1,
                                  **env))
    ready = 0
    while ready < count:  # mpirun may pass two ranks' lines as one
        ready += next(mpirun.stdout).count("READY")
    everyone = [mpirun.pid, *descendants(mpirun.pid)]
    ranks = {int(open(f"/proc/{pid}/environ").read().split("OMPI_COMM_WORLD_RANK=")[1]
                 .split("\0")[0]): pid
             for pid in everyone if script in open(f"/proc/{pid}/cmdline").read()
             and "mpirun" not in open(f"/proc/{pid}/cmdline").read()}
    assert sorted(ranks) == list(range(count)), everyone
    return mpirun, everyone, ranks


def test_under_mpirun_sigterm_to_a_rank_ends_every_process_naming_it(procs):
    mpirun, everyone, ranks = _mpirun(procs, 2, "loop.py")
    os.kill(ranks[1], signal.SIGTERM)
    noticed = time.monotonic()
    status, output = finish(mpirun, timeout=30)
    assert time.monotonic() - noticed < 10, output
    assert status != 0, output
    # mpirun names the rank and the signal; the scheduler and servers (which rank 0's
    # process started) name the worker the job lost.
    assert re.search(r"process rank 1 .* exited on signal 15", output), output
    assert "worker rank 1 (a worker on this host) disconnected" in output, output
    while (running := [pid for pid in everyone if runs(pid)]) and \
            time.monotonic() - noticed < 10:
        time.sleep(0.1)
    assert not running, output



def test_under_mpirun_an_elastic_worker_told_to_stop_leaves_and_the_others_go_on(procs):
    mpirun, _, ranks = _mpirun(procs, 3, "elastic_training.py", "120", "0.05",
                               BYTEPS_ELASTIC=1, BYTEPS_ELASTIC_MIN_WORKERS=2)
    wait_for_line(mpirun, r",2\]<stdout>:COMMIT rank \d+ step 10\b")
    os.kill(ranks[2], signal.SIGTERM)
    status, output = finish(mpirun, timeout=90)
    assert status == 0, output  # the leaver exits 0 too, and mpirun with it
    left = re.search(r",2\]<stdout>:PREEMPTED rank 2 step (\d+)", output)
    assert left, output
    reports = marked_json(re.sub(r"\[\d+,\d+\]<stdout>:", "\n", output))
    assert sorted(reports) == [0, 1], output
    for report in reports.values():
        assert report["sizes"] == [3, 2] and report["restores"] == 0, report
        assert report["weight"] == 120.0 and report["step"] == 120, report
