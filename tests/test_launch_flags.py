"""horovodrun's flags on bpslaunch (and perseusrun), each run through real jobs. -p and
-i (ssh's port and key) are run across hosts in test_multi_host.py."""

from __future__ import annotations

import json
import re
import sys

from harness import LAUNCH, base_env, finish, free_port, worker_command

import tf_bps

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} "


def test_version_and_check_build_answer_without_starting_a_job(procs):
    status, output = procs.run([*LAUNCH, "-v"], base_env())
    assert (status, output.strip()) == (0, f"bpslaunch (tf_bps) {tf_bps.__version__}")
    status, output = procs.run([sys.executable, "-m", "tf_bps.launch.perseusrun", "--version"],
                               base_env())
    assert (status, output.strip()) == (0, f"perseusrun (tf_bps) {tf_bps.__version__}")
    status, output = procs.run([*LAUNCH, "--check-build"], base_env())
    assert status == 0, output
    for line in ("[X] TensorFlow", "[X] Keras", "[X] Worker engine",
                 "[X] Summation server (bps_server)", "[X] TCP", "[ ] RDMA"):
        assert line in output, output


def test_output_files_timestamps_log_level_and_timeline(procs, tmp_path):
    logs, timeline = tmp_path / "logs", tmp_path / "timeline" / "rank0.json"
    command = [*LAUNCH, "--num-proc", "2", "--output-filename", str(logs),
               "--prefix-output-with-timestamp", "--log-level", "info", "--start-timeout", "120",
               "--timeline-filename", str(timeline), *worker_command("steady_sums.py")]
    status, output = procs.run(command, base_env(TEST_ROUNDS=8, BYTEPS_TRACE_START_STEP=2,
                                                 BYTEPS_TRACE_END_STEP=4), timeout=180)
    assert status == 0, output
    # On the console: every worker line tagged and stamped.
    for rank in range(2):
        assert re.search(rf"^{STAMP}\[{rank}\]: SUMS OK {rank}$", output, re.M), output
    # In the files: horovodrun's layout, each process's lines untagged.
    for rank in range(2):
        assert (logs / f"rank.{rank}" / "stdout").read_text().splitlines()[-1] == \
            f"SUMS OK {rank}"
    # --log-level INFO reached the scheduler (its own folder) and the workers.
    assert "job complete" in (logs / "scheduler" / "stderr").read_text()
    assert "worker rank 1 of 2 joined" in (logs / "rank.1" / "stderr").read_text()
    # --timeline-filename: rank 0 alone records, into that file, not BYTEPS_TRACE_DIR.
    events = json.loads(timeline.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = {event["args"]["step"] for event in events if "args" in event}
    assert steps == {2, 3, 4}, steps
    assert not (tmp_path / "traces").exists()


def test_start_timeout_bounds_the_wait_for_the_job_to_form(procs):
    # A server whose scheduler never comes, and a scheduler whose workers never come:
    # both give up after --start-timeout, naming it.
    env = base_env(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(),
                   DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=1)
    status, output = procs.run([*LAUNCH, "--start-timeout", "2"], {**env, "DMLC_ROLE": "server"},
                               timeout=30)
    assert status == 1 and "within 2 s" in output and "HOROVOD_START_TIMEOUT" in output, output
    status, output = procs.run([*LAUNCH, "--start-timeout", "2"],
                               {**env, "DMLC_ROLE": "scheduler"}, timeout=30)
    assert status == 1, output
    assert "registered within 2 s (HOROVOD_START_TIMEOUT)" in output, output


def test_bad_flag_values_are_refused_before_anything_starts(procs):
    for flags, why in ((["--log-level", "LOUD"], "invalid choice: 'LOUD'"),
                       (["--start-timeout", "0"], "HOROVOD_START_TIMEOUT='0' is not valid")):
        status, output = procs.run([*LAUNCH, "-np", "2", *flags, "true"], base_env(), timeout=30)
        assert status == 2 and why in output, output


QUIET_SCRIPT = ("import sys, tensorflow as tf, tf_bps as bps; bps.init(); "
                "print('SUM', bps.push_pull(tf.ones([2]), op=bps.Sum).numpy()); "
                "sys.stderr.write('W0000 00:00:1.5 7 some_kernel.cc:12] a warning of the job\\n')")


def _without_tf_log_level() -> dict[str, str]:
    env = base_env()
    del env["TF_CPP_MIN_LOG_LEVEL"]
    return env


def test_start_up_is_quiet_unless_asked_and_our_lines_say_when_and_where(procs):
    command = [*LAUNCH, "-np", "2", sys.executable, "-c", QUIET_SCRIPT]
    status, quiet = procs.run(command, _without_tf_log_level(), timeout=120)
    assert status == 0 and quiet.count("SUM [2. 2.]") == 2, quiet
    # TensorFlow's notices are gone; a warning of the same shape from elsewhere stays.
    for notice in ("All log messages before absl::InitializeLog", "oneDNN custom operations",
                   "cpu_feature_guard", "failed call to cuInit"):
        assert notice not in quiet, quiet
    assert quiet.count("some_kernel.cc:12] a warning of the job") == 2, quiet
    # --verbose shows them, and tf_bps's INFO lines, stamped with time, role and host,
    # from Python and from the core alike.
    status, verbose = procs.run([*LAUNCH, "--verbose", *command[len(LAUNCH):]],
                                _without_tf_log_level(), timeout=120)
    assert status == 0 and "All log messages before absl::InitializeLog" in verbose, verbose
    stamp = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} "
    assert re.search(stamp + r"tf_bps worker 1 on \S+ INFO\] worker rank 1 of 2 joined",
                     verbose), verbose
    assert re.search(stamp + r"tf_bps worker 1 on \S+ INFO\] worker 1 of 2 connected",
                     verbose), verbose
    assert re.search(stamp + r"tf_bps scheduler on \S+ INFO\] all workers finished", verbose)


def test_a_job_that_waits_says_every_few_seconds_who_is_missing(procs):
    # Worker 1 and the server never come: worker 0 hears from the scheduler whom the
    # job waits for, until the start timeout ends it. The scheduler says so every 5 s:
    # in 12 s, at 5 s and at 10 s, both heard by steady_sums.py, which imports no
    # TensorFlow and so registers within a second or two even on a loaded machine.
    job = procs.start_job_by_role(1, 0, "steady_sums.py", DMLC_NUM_WORKER=2, DMLC_NUM_SERVER=1,
                                  HOROVOD_START_TIMEOUT=12)
    status, output = finish(job["worker0"], 60)
    assert status != 0, output
    waits = re.findall(r"the job waits for worker rank\(s\) \[1\] and 1 more server\(s\)",
                       output)
    assert len(waits) >= 2, output
    assert "registered within 12 s (HOROVOD_START_TIMEOUT)" in output, output
