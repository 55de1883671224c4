"""Prometheus endpoints (BYTEPS_METRICS_PORT) through a real job: bpslaunch gives the
scheduler, the server and each worker of this machine its own port from the one given,
each logs where it serves, and every endpoint is scraped while the job runs and parsed
with prometheus-client's own parser."""

import re
import socket
import threading
import time
import urllib.request

import pytest
from harness import LAUNCH, base_env, module_job, worker_command

parser = pytest.importorskip("prometheus_client.parser")

ELEMENTS = 50000  # float32: 200 KB a push_pull, in the "1MiB" size class


def _free_ports(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1."""
    for first in range(23000, 60000, 97):
        sockets = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no free range of ports")


def scrape(port: int) -> dict:
    """{(name, labels...): value} of one endpoint's samples."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, *sorted(sample.labels.items()))] = sample.value
    return samples


def _scrape_when(port: int, ready, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            samples = scrape(port)
            if ready(samples):
                return samples
        except OSError:
            pass
        assert time.monotonic() < deadline, f"no ready endpoint at port {port}"
        time.sleep(0.2)


class _Lines:
    """A running process's output lines, read on a thread of their own."""

    def __init__(self, process):
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(process.stdout))
        self._reader.start()

    def endpoints(self, count: int, timeout: float = 90) -> dict[str, int]:
        """{"scheduler": port, "worker 0": port, ...} once `count` processes said where
        they serve."""
        deadline = time.monotonic() + timeout
        while True:
            found = {f"{m[1]}{m[2] or ''}": int(m[3]) for m in map(ENDPOINT.search, self.lines)
                     if m}
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, "".join(self.lines)
            time.sleep(0.1)

    def rest(self, timeout: float) -> str:
        """The whole output, once the process closed it."""
        self._reader.join(timeout)
        assert not self._reader.is_alive(), "".join(self.lines)
        return "".join(self.lines)


ENDPOINT = re.compile(r"tf_bps (scheduler|server|worker)( \d+)?\b.* metrics at "
                      r"http://[^:]+:(\d+)/metrics")


@module_job
def metrics_job(processes, tmp_path_factory):
    """bpslaunch -np 2 --num-servers 1 with BYTEPS_METRICS_PORT=P: the scheduler at P,
    the server at P + 1, the workers at P + 2 and P + 3."""
    first = _free_ports(4)
    job = processes.start(
        [*LAUNCH, "-np", "2", "--num-servers", "1", *worker_command("steady_sums.py")],
        base_env(BYTEPS_METRICS_PORT=first, TEST_ROUNDS=200, TEST_ELEMENTS=ELEMENTS))
    lines = _Lines(job)
    ports = lines.endpoints(3)
    scrapes = {"worker 0": _scrape_when(
        ports["worker 0"], lambda s: s.get(("tf_bps_worker_steps_total",), 0) >= 5)}
    # A stranger's connection that never sends a byte holds the endpoint at most its
    # request deadline: the scrapes that follow it still answer.
    stranger = socket.create_connection(("127.0.0.1", ports["worker 0"]))
    started = time.monotonic()
    for name, port in ports.items():
        scrapes[f"{name} again" if name in scrapes else name] = scrape(port)
    waited = time.monotonic() - started
    stranger.close()
    output = lines.rest(timeout=120)
    return {"status": job.wait(), "output": output, "scrapes": scrapes, "ports": ports,
            "first": first, "waited": waited}


def test_the_job_ends_well_and_each_process_says_where_it_serves(metrics_job):
    output = metrics_job["output"]
    assert metrics_job["status"] == 0, output
    assert output.count("SUMS OK") == 2, output
    first = metrics_job["first"]
    assert metrics_job["ports"] == {"scheduler": first, "worker 0": first + 2,
                                    "worker 1": first + 3}, output


def test_workers_count_steps_bytes_and_push_pull_times(metrics_job):
    first, again = metrics_job["scrapes"]["worker 0"], metrics_job["scrapes"]["worker 0 again"]
    assert again[("tf_bps_worker_steps_total",)] > first[("tf_bps_worker_steps_total",)]
    assert again[("tf_bps_worker_rank",)] == 0 and again[("tf_bps_worker_size",)] == 2
    steps = again[("tf_bps_worker_steps_total",)]
    # Each step pushes and pulls the tensor once, whole (one server, no compression).
    assert again[("tf_bps_worker_pushed_bytes_total",)] >= steps * ELEMENTS * 4
    assert again[("tf_bps_worker_pulled_bytes_total",)] >= steps * ELEMENTS * 4
    assert again[("tf_bps_worker_compression_ratio",)] == 1.0
    assert abs(time.time() - again[("tf_bps_worker_last_step_timestamp_seconds",)]) < 60
    assert 0 < again[("tf_bps_worker_last_step_seconds",)] < 10
    finished = again[("tf_bps_worker_push_pull_seconds_count", ("size", "1MiB"))]
    # One push_pull a step, begun before its step counts.
    assert steps <= finished <= steps + 1
    assert again[("tf_bps_worker_push_pull_seconds_bucket", ("le", "+Inf"),
                  ("size", "1MiB"))] == finished
    assert again[("tf_bps_worker_push_pull_seconds_count", ("size", "4KiB"))] == 0
    assert again[("tf_bps_worker_failed_operations_total",)] == 0
    assert ("process_resident_memory_bytes",) in again
    assert metrics_job["scrapes"]["worker 1"][("tf_bps_worker_rank",)] == 1


def test_the_scheduler_counts_its_members(metrics_job):
    scheduler = metrics_job["scrapes"]["scheduler"]
    assert scheduler[("tf_bps_scheduler_workers",)] == 2
    assert scheduler[("tf_bps_scheduler_servers",)] == 1
    assert scheduler[("tf_bps_scheduler_generation",)] == 0
    assert scheduler[("tf_bps_scheduler_forming",)] == 0
    assert scheduler[("tf_bps_scheduler_reforms_total",)] == 0
    assert scheduler[("tf_bps_scheduler_turned_away_total", ("why", "refused"))] == 0


def test_a_silent_stranger_delays_a_scrape_by_the_request_deadline_at_most(metrics_job):
    assert metrics_job["waited"] < 2.0 + 5, metrics_job["waited"]


def test_a_port_that_is_taken_fails_init_naming_the_variable(procs):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, output = procs.run(worker_command("steady_sums.py"),
                                   base_env(BYTEPS_METRICS_PORT=port, TEST_ROUNDS=1), timeout=60)
    assert status != 0, output
    assert f"BYTEPS_METRICS_PORT={port}: the worker's" in output, output
    assert "cannot listen there" in output, output
