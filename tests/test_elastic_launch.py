"""bpslaunch's elastic options, through whole jobs: the reset limit, hosts that a
discovery script adds and removes, and the blacklist of hosts whose workers failed
(Horovod's elastic integration scenarios, in our words)."""

import os
import subprocess
import time

import pytest
from harness import LAUNCH, base_env, finish, worker_command
from harness import marked_json as reports

# A dead worker that no server saw close its connection is found by its silence, and a
# failed elastic job's scheduler stays a heartbeat timeout to tell workers between
# two registrations why: 3 s instead of the default 10 s. Heartbeats still come every
# 0.5 s, six to a timeout, so a live process on a busy machine is not taken for dead.
FAST_HEARTBEAT = {"PS_HEARTBEAT_INTERVAL": 0.5, "PS_HEARTBEAT_TIMEOUT": 3}


@pytest.mark.parametrize("limit", [1, 2])
def test_an_elastic_job_within_and_past_its_reset_limit(procs, limit):
    # Two workers of four die one after the other, so the job re-forms twice: a limit
    # of 1 ends it, a limit of 2 lets it finish.
    status, output = procs.launch(4, "elastic_training.py", "60", "0.02", num_servers=1,
                                  extra=["--min-np", "2", "--reset-limit", str(limit)],
                                  timeout=150, ELASTIC_DIE="1@15,2@30")
    assert output.count("DYING") == 2, output
    if limit == 1:
        assert status != 0, output
        assert "BYTEPS_ELASTIC_RESET_LIMIT=1 (--reset-limit) allows no more" in output, output
        return
    assert status == 0, output
    got = reports(output)
    assert sorted(got) == [0, 1], output
    for report in got.values():
        assert report["sizes"] == [4, 3, 2] and report["weight"] == 60.0, report


class DiscoveredJob:
    """bpslaunch with a discovery script that prints a file the test rewrites."""

    def __init__(self, procs, tmp_path, hosts: str, *options: str, steps: int = 200, **env):
        self.hosts_file = tmp_path / "hosts"
        self.set_hosts(hosts)
        script = tmp_path / "discover.sh"
        script.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        script.chmod(0o755)
        command = [*LAUNCH, "--host-discovery-script", str(script), *options,
                   *worker_command("elastic_training.py", str(steps), "0.05")]
        self.process = procs.start(command, base_env(**env))
        self.lines: list[str] = []

    def set_hosts(self, hosts: str) -> None:
        self.hosts_file.write_text(hosts.replace(",", "\n") + "\n")

    def wait_for(self, text: str, count: int = 1, timeout: float = 90) -> None:
        """Reads the job's output until `text` appeared `count` times."""
        deadline = time.monotonic() + timeout
        while sum(text in line for line in self.lines) < count:
            assert time.monotonic() < deadline, "\n".join(self.lines)
            line = self.process.stdout.readline()
            assert line, "\n".join(self.lines)
            self.lines.append(line.rstrip("\n"))

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        status, rest = finish(self.process, timeout)
        return status, "\n".join(self.lines) + "\n" + rest


def test_hosts_added_then_removed_by_the_discovery_script(procs, tmp_path):
    # Two slots, then a second host doubles the job, then it goes away again: 2 -> 4 -> 2
    # workers, with every sum checked against the size.
    job = DiscoveredJob(procs, tmp_path, "localhost:2", "--min-np", "2", "--max-np", "4",
                        steps=300)
    job.wait_for("COMMIT", 2)
    job.set_hosts("localhost:2,127.0.0.1:2")
    job.wait_for("size 4", 2)
    job.wait_for("COMMIT", 8)
    job.set_hosts("localhost:2")
    job.wait_for("leave at their next commit")
    status, output = job.finish()
    assert status == 0, output
    got = reports(output)
    assert sorted(got) == [0, 1], output
    for report in got.values():
        # The second host's two workers join together: the launcher tells the
        # scheduler it started both, and the job re-forms once both registered.
        assert report["sizes"] == [2, 4, 2], report
        # The host left at a commit: nothing was restored, and only the start and
        # the additions synced (Horovod's removals skip it); every step counted once.
        assert report["restores"] == 0 and report["syncs"] == len(report["sizes"]) - 1, report
        assert report["weight"] == 300.0, report
    # The second host's workers heard they were let go, and left at that commit on
    # their own: the scheduler refused none, and the launcher ended none.
    assert output.count("leaves the job as its host left the job") == 2, output
    assert "was let go" not in output and "did not leave within" not in output, output


def test_losing_the_host_of_rank_0_leaves_the_other_host_training(procs, tmp_path):
    # Horovod's scenario: both workers of the first host (ranks 0 and 1) die at one
    # step; the job goes from 4 to 2 and its new rank 0 is on the other host.
    job = DiscoveredJob(procs, tmp_path, "localhost:2,127.0.0.1:2", "--min-np", "2",
                        steps=100, ELASTIC_DIE="localhost@20", **FAST_HEARTBEAT)
    status, output = job.finish(timeout=180)
    assert status == 0, output
    assert output.count("DYING") == 2, output
    got = reports(output)
    assert sorted(got) == [0, 1], output
    for report in got.values():
        assert report["host"] == "127.0.0.1" and report["weight"] == 100.0, report
        assert report["sizes"][0] == 4 and report["sizes"][-1] == 2, report


def test_a_failed_host_is_blacklisted_for_its_cooldown_and_then_used_again(procs, tmp_path):
    job = DiscoveredJob(procs, tmp_path, "localhost:1,127.0.0.1:1", "--min-np", "1",
                        "--blacklist-cooldown-range", "2", "2", steps=60,
                        ELASTIC_DIE="127.0.0.1@20", ELASTIC_FINISH_AT_SIZE=2)
    job.wait_for("DYING")
    job.wait_for("host 127.0.0.1 is blacklisted")
    status, output = job.finish()
    assert status == 0, output
    assert "for 2 s" in output, output
    got = reports(output)
    assert sorted(got) == [0, 1], output
    # The survivor went on alone, and took in a new worker on the host once its
    # cooldown ended (the survivor's last steps wait for it); that one started from the
    # survivor's state.
    assert got[0]["sizes"] == [2, 1, 2] and got[0]["weight"] == 60.0, got
    assert got[1]["sizes"] == [2] and got[1]["weight"] == 60.0, got


def test_every_worker_failing_ends_the_job_with_a_message(procs, tmp_path):
    job = DiscoveredJob(procs, tmp_path, "localhost:1,127.0.0.1:1", "--min-np", "1",
                        steps=100, ELASTIC_DIE="localhost@10,127.0.0.1@10", **FAST_HEARTBEAT)
    status, output = job.finish()
    assert status != 0, output
    assert "every worker failed" in output, output


def test_elastic_options_are_checked_before_anything_starts():
    for options, message in (
            (["-np", "1", "--reset-limit", "2"], "--reset-limit is for elastic jobs"),
            (["-np", "4", "--min-np", "5"], "elastic sizes must satisfy"),
            (["--host-discovery-script", "true", "-H", "localhost:2"], "give no -H")):
        done = subprocess.run([*LAUNCH, *options, "true"], env=base_env(), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, (options, done.stderr)
    assert os.path.exists(LAUNCH[0])
