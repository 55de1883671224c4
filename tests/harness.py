"""What tests use to run real tf_bps jobs: scheduler, servers and workers as processes,
started on free ports and ended by PID, and the reports their workers print. Imported
by test modules (conftest.py holds only pytest's hooks and fixtures)."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
WORKERS = TESTS / "workers"
LAUNCH = [sys.executable, "-m", "tf_bps.launch"]
sys.path.insert(0, str(WORKERS))  # cases.py is shared by worker scripts and tests.


def marked_json(output: str, marker: str = "REPORT") -> dict[int, dict]:
    """The JSON objects workers print after `marker `, by their "rank" field. A line the
    core logged to stderr meanwhile may run on after the object (the two streams share
    the pipe): the object ends where its JSON does."""
    found = {}
    for line in output.splitlines():
        if f"{marker} " in line:
            report, _ = json.JSONDecoder().raw_decode(line.split(f"{marker} ", 1)[1])
            found[report["rank"]] = report
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tcp_sockets() -> list[tuple[tuple[str, int], tuple[str, int], str]]:
    """This machine's IPv4 TCP sockets (/proc/net/tcp) as (local, remote, state): the ends
    as ("127.0.0.1", 8080), the state as the kernel's code ("01" established, "0A"
    listening)."""
    def address(field: str) -> tuple[str, int]:
        host, port = field.split(":")
        return socket.inet_ntoa(struct.pack("<I", int(host, 16))), int(port, 16)

    return [(address(local), address(remote), state)
            for local, remote, state in (line.split()[1:4] for line in
                                         open("/proc/net/tcp").read().splitlines()[1:])]


def base_env(**overrides) -> dict[str, str]:
    """The test's environment without any job variables, plus `overrides`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "BYTEPS_", "PS_"))}
    # PYTHONFAULTHANDLER: a process that crashes prints where each of its threads was.
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1",
               PYTHONPATH=os.pathsep.join([str(WORKERS), env.get("PYTHONPATH", "")]))
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def wait_for_line(process: subprocess.Popen, pattern: str) -> re.Match:
    """Reads a process's output up to a line matching `pattern` (the test's timeout
    bounds the wait); the rest stays for finish()."""
    for line in process.stdout:
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"{process.args} ended before printing {pattern!r}")


def scrape(port: int, timeout: float = 10) -> dict:
    """{(name, labels...): value} of the samples a Prometheus endpoint on this machine
    serves (BYTEPS_METRICS_PORT), parsed by prometheus-client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=")
        text = answer.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, *sorted(sample.labels.items()))] = sample.value
    return samples


def runs(pid: int) -> bool:
    """Whether process `pid` has not exited (a zombie, which nobody reaped yet, has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, as they are now."""
    found = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(task) as listed:
                children = [int(child) for child in listed.read().split()]
        except FileNotFoundError:
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


def worker_command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(WORKERS / script), *args]


class Processes:
    """Starts processes in their own sessions and ends exactly those, by PID."""

    def __init__(self):
        self.started: list[subprocess.Popen] = []

    def start(self, command: list[str], env: dict[str, str], cwd=None) -> subprocess.Popen:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, cwd=cwd,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.started.append(process)
        return process

    def reports(self, num_workers: int, script: str, *args: str, **kwargs):
        """launch(), which must succeed with a REPORT from every rank: (the reports by
        rank, the output)."""
        status, output = self.launch(num_workers, script, *args, **kwargs)
        assert status == 0, output
        got = marked_json(output)
        assert sorted(got) == list(range(num_workers)), output
        return got, output

    def run(self, command: list[str], env: dict[str, str], timeout: float = 120, cwd=None):
        """Runs to completion; returns (exit status, combined output)."""
        return finish(self.start(command, env, cwd), timeout)

    def launch(self, num_workers: int, script: str, *args: str, num_servers: int | None = None,
               timeout: float = 120, extra: tuple[str, ...] = (), **env):
        """bpslaunch -np N [extra options]: a whole job on this machine."""
        command = [*LAUNCH, "-np", str(num_workers), *extra]
        if num_servers is not None:
            command += ["--num-servers", str(num_servers)]
        return self.run([*command, *worker_command(script, *args)], base_env(**env), timeout)

    def start_job_by_role(self, num_workers: int, num_servers: int, script: str, *args: str,
                          **env) -> dict[str, subprocess.Popen]:
        """Starts every role separately, as on several machines (DMLC_ROLE + bpslaunch)."""
        common = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": free_port(),
                  "DMLC_NUM_WORKER": num_workers, "DMLC_NUM_SERVER": num_servers, **env}
        self.job_env = common
        procs = {"scheduler": self.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **common))}
        for server in range(num_servers):
            procs[f"server{server}"] = self.start(LAUNCH, base_env(DMLC_ROLE="server", **common))
        for rank in range(num_workers):
            procs[f"worker{rank}"] = self.start_worker(script, *args, DMLC_WORKER_ID=rank)
        return procs

    def start_worker(self, script: str, *args: str, **env) -> subprocess.Popen:
        """A worker of the job start_job_by_role started last (one that joins an elastic
        job later, say)."""
        return self.start([*LAUNCH, *worker_command(script, *args)],
                          base_env(**{"DMLC_ROLE": "worker", **self.job_env, **env}))

    @staticmethod
    def end(process: subprocess.Popen) -> None:
        """Ends the process, its group, and whatever it started in groups of their own
        (mpirun's ranks, say), by PID."""
        if process.poll() is None:
            started = descendants(process.pid)
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for pid in started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        process.wait()

    def end_all(self) -> None:
        for process in self.started:
            self.end(process)


def finish(process: subprocess.Popen, timeout: float) -> tuple[int, str]:
    """Waits for a started process; fails the test (not hangs) past `timeout`."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        Processes.end(process)
        output, _ = process.communicate()
        pytest.fail(f"process {process.args} still running after {timeout} s:\n{output}")
    return process.returncode, output


# The module fixtures made by module_job: their tests are jobs (conftest.py marks them).
JOB_FIXTURES: set[str] = set()


def module_job(start):
    """A module fixture for one job that many tests check: `start(processes,
    tmp_path_factory)` starts it with processes of its own, all ended when it returns,
    and returns what the tests read. The fixture takes the function's name."""
    JOB_FIXTURES.add(start.__name__)

    @pytest.fixture(scope="module", name=start.__name__)
    def fixture(tmp_path_factory):
        processes = Processes()
        try:
            return start(processes, tmp_path_factory)
        finally:
            processes.end_all()

    fixture.__doc__ = start.__doc__
    return fixture
