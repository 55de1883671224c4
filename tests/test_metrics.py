"""Prometheus endpoints (BYTEPS_METRICS_PORT) through one real job: bpslaunch gives the
scheduler, the server and each worker of this machine its own port from the one given,
each logs where it serves, and every endpoint is scraped while the job runs and parsed
with prometheus-client's own parser. The worker that pushes late is the straggler the
server shows, and strangers that say nothing, trickle or flood hold a proper scrape at
most their request deadlines."""

import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from harness import LAUNCH, base_env, module_job, scrape, worker_command

pytest.importorskip("prometheus_client")

ELEMENTS = 50000  # float32: 200 KB a push_pull, one partition, in the "1MiB" size class
ROUNDS = 60
DEADLINE_S = 2.0  # a request's, at every endpoint (metrics.py, MetricsEndpoint)
ENDPOINT = re.compile(r"tf_bps (scheduler|server|worker)( \d+)?\b.* metrics at "
                      r"http://[^:]+:(\d+)/metrics")


def scrape_when(port: int, ready, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(port)
        if ready(samples):
            return samples
        assert time.monotonic() < deadline, samples
        time.sleep(0.1)


def http_status(port: int, method: str, path: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def rank_sample(samples: dict, name: str, rank: int) -> float:
    return samples[(f"tf_bps_server_{name}", ("worker_rank", str(rank)))]


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


def strangers(port: int) -> list[threading.Thread]:
    """Three hostile clients, connected in this order: one that says nothing, one that
    trickles a request a byte at a time for longer than the deadline, and one that sends
    100 KB of garbage. Each thread ends when the endpoint dropped its connection."""

    def silent():
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(15)
            sock.recv(1)  # EOF once the endpoint gives up on it

    def trickle():
        with socket.create_connection(("127.0.0.1", port)) as sock:
            try:
                for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n" * 4:
                    sock.send(bytes([byte]))
                    time.sleep(0.1)
            except OSError:
                pass  # dropped mid-trickle, as it should be

    def flood():
        with socket.create_connection(("127.0.0.1", port)) as sock:
            try:
                sock.sendall(bytes(range(256)) * 400)
                sock.settimeout(15)
                sock.recv(100)
            except OSError:
                pass

    threads = []
    for client in (silent, trickle, flood):
        threads.append(threading.Thread(target=client, daemon=True))
        threads[-1].start()
        time.sleep(0.05)  # connect in this order: the endpoint serves them in turn
    return threads


class _Lines:
    """A running process's output lines, read on a thread of their own."""

    def __init__(self, process):
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(process.stdout))
        self._reader.start()

    def endpoints(self, count: int, timeout: float = 90) -> dict[str, int]:
        """{"scheduler": port, "server": port, "worker 0": port, ...} once `count`
        processes said where they serve."""
        deadline = time.monotonic() + timeout
        while True:
            found = {f"{m[1]}{m[2] or ''}": int(m[3])
                     for m in map(ENDPOINT.search, list(self.lines)) if m}
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, "".join(self.lines)
            time.sleep(0.1)

    def rest(self, timeout: float) -> str:
        """The whole output, once the process closed it."""
        self._reader.join(timeout)
        assert not self._reader.is_alive(), "".join(self.lines)
        return "".join(self.lines)


def _hostile_clients_at(port: int) -> dict:
    """A proper scrape while strangers hold the endpoint, and how long it waited."""
    threads = strangers(port)
    started = time.monotonic()
    during = scrape(port, timeout=15)
    waited = time.monotonic() - started
    for thread in threads:
        thread.join(15)
    return {"during": during, "waited": waited,
            "left": sum(thread.is_alive() for thread in threads),
            "statuses": (http_status(port, "GET", "/"), http_status(port, "GET", "/nothing"))}


@module_job
def metrics_job(processes, tmp_path_factory):
    """bpslaunch -np 2 --num-servers 1 with BYTEPS_METRICS_PORT=P (the scheduler at P, the
    server at P + 1, the workers at P + 2 and P + 3); rank 1 pushes 150 ms after rank 0
    every round, and the servers judge stragglers every second."""
    first = _free_ports(4)
    job = processes.start(
        [*LAUNCH, "-np", "2", "--num-servers", "1", *worker_command("steady_sums.py")],
        base_env(BYTEPS_METRICS_PORT=first, TEST_ROUNDS=ROUNDS, TEST_ELEMENTS=ELEMENTS,
                 TEST_SLOW_RANK=1, TEST_SLOW_MS=150, BYTEPS_STRAGGLER_WINDOW_SECONDS=1,
                 BYTEPS_STRAGGLER_THRESHOLD_MS=60))
    lines = _Lines(job)
    ports = lines.endpoints(4)
    server = ports["server"]
    scrapes = {
        "worker 0": scrape_when(ports["worker 0"],
                                lambda s: s.get(("tf_bps_worker_steps_total",), 0) >= 3),
        "server": scrape_when(server, lambda s: s[("tf_bps_server_rounds_total",)] >= 3)}
    hostile = {}  # both endpoints at once: the job runs for some 10 s only

    def attack(endpoint: str, port: int) -> None:
        hostile[endpoint] = _hostile_clients_at(port)

    threads = [threading.Thread(target=attack, args=("server", server)),
               threading.Thread(target=attack, args=("worker", ports["worker 1"]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for name, port in ports.items():
        scrapes[f"{name} again" if name in scrapes else name] = scrape(port)
    # The last judged window named rank 1 (a window ends at the first round after 1 s).
    scrapes["server later"] = scrape_when(
        server, lambda s: rank_sample(s, "straggler", 1) == 1 and
        s[("tf_bps_server_rounds_total",)] > scrapes["server"][("tf_bps_server_rounds_total",)])
    output = lines.rest(timeout=120)
    return {"status": job.wait(), "output": output, "scrapes": scrapes, "ports": ports,
            "first": first, "hostile": hostile}


def test_the_job_ends_well_and_each_process_says_where_it_serves(metrics_job):
    output = metrics_job["output"]
    assert metrics_job["status"] == 0, output
    assert output.count("SUMS OK") == 2, output
    first = metrics_job["first"]
    assert metrics_job["ports"] == {"scheduler": first, "server": first + 1,
                                    "worker 0": first + 2, "worker 1": first + 3}, output


def test_workers_count_steps_bytes_and_push_pull_times(metrics_job):
    scrapes = metrics_job["scrapes"]
    first, again = scrapes["worker 0"], scrapes["worker 0 again"]
    assert again[("tf_bps_worker_steps_total",)] > first[("tf_bps_worker_steps_total",)]
    assert again[("tf_bps_worker_rank",)] == 0 and again[("tf_bps_worker_size",)] == 2
    assert scrapes["worker 1"][("tf_bps_worker_rank",)] == 1
    steps = again[("tf_bps_worker_steps_total",)]
    # Each step pushes and pulls the tensor once, whole (one server, no compression).
    assert again[("tf_bps_worker_pushed_bytes_total",)] >= steps * ELEMENTS * 4
    assert again[("tf_bps_worker_pulled_bytes_total",)] >= steps * ELEMENTS * 4
    assert again[("tf_bps_worker_compression_ratio",)] == 1.0
    assert abs(time.time() - again[("tf_bps_worker_last_step_timestamp_seconds",)]) < 60
    assert 0 < again[("tf_bps_worker_last_step_seconds",)] < 10
    finished = again[("tf_bps_worker_push_pull_seconds_count", ("size", "1MiB"))]
    assert steps <= finished <= steps + 1  # one push_pull a step, begun before it counts
    assert again[("tf_bps_worker_push_pull_seconds_bucket", ("le", "+Inf"),
                  ("size", "1MiB"))] == finished
    # Rank 0 waits for the late rank 1 in every round: its push_pulls take 150 ms or so.
    assert again[("tf_bps_worker_push_pull_seconds_bucket", ("le", "0.1"),
                  ("size", "1MiB"))] < finished / 2
    assert again[("tf_bps_worker_push_pull_seconds_count", ("size", "4KiB"))] == 0
    assert again[("tf_bps_worker_failed_operations_total",)] == 0
    assert ("process_resident_memory_bytes",) in again


def test_the_scheduler_counts_its_members(metrics_job):
    scheduler = metrics_job["scrapes"]["scheduler"]
    assert scheduler[("tf_bps_scheduler_workers",)] == 2
    assert scheduler[("tf_bps_scheduler_servers",)] == 1
    assert scheduler[("tf_bps_scheduler_generation",)] == 0
    assert scheduler[("tf_bps_scheduler_forming",)] == 0
    assert scheduler[("tf_bps_scheduler_reforms_total",)] == 0
    assert scheduler[("tf_bps_scheduler_turned_away_total", ("why", "refused"))] == 0


def test_the_server_counts_rounds_and_bytes(metrics_job):
    first, later = metrics_job["scrapes"]["server"], metrics_job["scrapes"]["server later"]
    rounds = later[("tf_bps_server_rounds_total",)]
    assert rounds > first[("tf_bps_server_rounds_total",)] >= 3
    assert later[("tf_bps_server_workers",)] == 2
    assert later[("tf_bps_server_queue_depth",)] >= 0
    # Each round: one 200 KB push from each worker in, the 200 KB sum to each out.
    received = later[("tf_bps_server_received_bytes_total",)]
    sent = later[("tf_bps_server_sent_bytes_total",)]
    assert 2 * rounds * ELEMENTS * 4 <= received <= 2 * (rounds + 2) * ELEMENTS * 4 + 100000
    assert 2 * rounds * ELEMENTS * 4 <= sent <= 2 * (rounds + 1) * ELEMENTS * 4 + 100000
    # Every push that took part in a round is counted once, under its worker's rank.
    pushes = sum(rank_sample(later, "push_lateness_seconds_count", r) for r in (0, 1))
    assert 2 * rounds <= pushes <= 2 * rounds + 2


def test_the_late_worker_is_the_straggler_and_its_pushes_are_late(metrics_job):
    later = metrics_job["scrapes"]["server later"]
    assert rank_sample(later, "straggler", 1) == 1
    assert rank_sample(later, "straggler", 0) == 0
    late = {r: rank_sample(later, "push_lateness_seconds_sum", r) /
            rank_sample(later, "push_lateness_seconds_count", r) for r in (0, 1)}
    assert late[1] >= 0.1 and late[1] > 20 * late[0], late


@pytest.mark.parametrize("endpoint", ["server", "worker"])
def test_hostile_clients_hold_a_scrape_at_most_their_deadlines(metrics_job, endpoint):
    # Served one at a time: the silent and the trickling client cost a deadline each,
    # the flood ends at the size bound; then the proper scrape is answered.
    hostile = metrics_job["hostile"][endpoint]
    assert hostile["during"], hostile
    assert hostile["waited"] < 2 * DEADLINE_S + 3, hostile["waited"]
    assert hostile["left"] == 0
    assert hostile["statuses"] == (200, 404)


def _taken_port_run(procs, command: list[str], **env) -> tuple[int, str, int]:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, output = procs.run(command, base_env(BYTEPS_METRICS_PORT=port, **env),
                                   timeout=60)
    return status, output, port


def test_a_port_that_is_taken_fails_a_worker_naming_the_variable(procs):
    status, output, port = _taken_port_run(procs, worker_command("steady_sums.py"),
                                           TEST_ROUNDS=1)
    assert status != 0, output
    assert (f"BYTEPS_METRICS_PORT={port}: the worker's Prometheus endpoint cannot listen "
            "there (Address already in use)") in output, output


def test_a_port_that_is_taken_fails_the_server_naming_the_variable(procs):
    status, output, port = _taken_port_run(
        procs, [sys.executable, "-m", "tf_bps.control.server"], DMLC_ROLE="server",
        DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT="9", DMLC_NUM_WORKER="1",
        DMLC_NUM_SERVER="1")
    assert status == 2, output
    assert (f"tf_bps server: BYTEPS_METRICS_PORT={port}: the server's Prometheus endpoint "
            "cannot listen there (Address already in use)") in output, output
