"""The native server's Prometheus endpoint (BYTEPS_METRICS_PORT, custom_ops/server/
metrics_endpoint.h) through a real job: where it serves is logged, its figures grow as
the job runs and are parsed with prometheus-client's own parser, the worker that pushes
late is the straggler it shows, and strangers that trickle, flood or say nothing do not
keep a proper scrape from its answer nor the server from finishing the job."""

import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from harness import LAUNCH, base_env, module_job, worker_command

parser = pytest.importorskip("prometheus_client.parser")

ELEMENTS = 50000  # float32: 200 KB a push, one partition
DEADLINE_S = 2.0  # MetricsEndpoint::kDeadlineMs
SERVER_ENDPOINT = re.compile(r"tf_bps server\b[^\]]*\] metrics at http://[^:/]+:(\d+)/metrics")


def scrape(port: int, timeout: float = 10) -> dict:
    """{(name, labels...): value} of the endpoint's samples."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as answer:
        assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = answer.read().decode()
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, *sorted(sample.labels.items()))] = sample.value
    return samples


def scrape_when(port: int, ready, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(port)
        if ready(samples):
            return samples
        assert time.monotonic() < deadline, samples
        time.sleep(0.1)


def rank_sample(samples: dict, name: str, rank: int) -> float:
    return samples[(f"tf_bps_server_{name}", ("worker_rank", str(rank)))]


def http_status(port: int, method: str, path: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def strangers(port: int) -> list[threading.Thread]:
    """Three hostile clients, connected in this order: one that says nothing, one that
    trickles a request a byte at a time for longer than the deadline, and one that sends
    100 KB of garbage. Each thread ends when the server dropped its connection."""

    def silent():
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(15)
            sock.recv(1)  # EOF once the server gives up on it

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


@module_job
def metrics_job(processes, tmp_path_factory):
    """bpslaunch -np 2 --num-servers 1 with BYTEPS_METRICS_PORT=0 (each process takes any
    free port and logs it); rank 1 pushes 150 ms after rank 0 every round."""
    job = processes.start(
        [*LAUNCH, "-np", "2", "--num-servers", "1", *worker_command("steady_sums.py")],
        base_env(BYTEPS_METRICS_PORT=0, TEST_ROUNDS=40, TEST_ELEMENTS=ELEMENTS,
                 TEST_SLOW_RANK=1, TEST_SLOW_MS=150, BYTEPS_STRAGGLER_WINDOW_SECONDS=1,
                 BYTEPS_STRAGGLER_THRESHOLD_MS=60))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    port = None
    while port is None:
        port = next((int(m[1]) for m in map(SERVER_ENDPOINT.search, list(lines)) if m), None)
        assert port is not None or time.monotonic() < deadline, "".join(lines)
        time.sleep(0.05)
    result = {"port": port}
    result["first"] = scrape_when(port, lambda s: s[("tf_bps_server_rounds_total",)] >= 3)
    threads = strangers(port)
    started = time.monotonic()
    result["during"] = scrape(port, timeout=15)
    result["waited"] = time.monotonic() - started
    result["not_found"] = http_status(port, "GET", "/nothing")
    result["not_allowed"] = http_status(port, "POST", "/metrics")
    result["root"] = http_status(port, "GET", "/")
    # The last judged window named rank 1 (a window ends at the first round after 1 s).
    result["later"] = scrape_when(
        port, lambda s: rank_sample(s, "straggler", 1) == 1 and
        s[("tf_bps_server_rounds_total",)] > result["first"][("tf_bps_server_rounds_total",)])
    for thread in threads:
        thread.join(15)
    result["strangers_left"] = sum(thread.is_alive() for thread in threads)
    result["status"] = job.wait(timeout=90)
    reader.join(10)
    result["output"] = "".join(lines)
    return result


def test_the_server_logs_its_endpoint_and_ends_the_job_well(metrics_job):
    output = metrics_job["output"]
    assert metrics_job["status"] == 0, output
    assert output.count("SUMS OK") == 2, output
    assert (metrics_job["root"], metrics_job["not_found"], metrics_job["not_allowed"]) == (
        200, 404, 405)


def test_rounds_and_bytes_grow_with_the_pushes(metrics_job):
    first, later = metrics_job["first"], metrics_job["later"]
    rounds = later[("tf_bps_server_rounds_total",)]
    assert rounds > first[("tf_bps_server_rounds_total",)] >= 3
    assert later[("tf_bps_server_workers",)] == 2
    assert later[("tf_bps_server_queue_depth",)] >= 0
    # Each round: one 200 KB push from each worker in, the 200 KB sum to each out.
    received = later[("tf_bps_server_received_bytes_total",)]
    sent = later[("tf_bps_server_sent_bytes_total",)]
    assert 2 * rounds * ELEMENTS * 4 <= received <= 2 * (rounds + 2) * ELEMENTS * 4 + 100000
    assert 2 * rounds * ELEMENTS * 4 <= sent <= 2 * (rounds + 1) * ELEMENTS * 4 + 100000
    assert received >= first[("tf_bps_server_received_bytes_total",)]
    # Every push that took part in a round is counted once, under its worker's rank.
    pushes = sum(rank_sample(later, "push_lateness_seconds_count", r) for r in (0, 1))
    assert 2 * rounds <= pushes <= 2 * rounds + 2


def test_the_late_worker_is_the_straggler_and_its_pushes_are_late(metrics_job):
    later = metrics_job["later"]
    assert rank_sample(later, "straggler", 1) == 1
    assert rank_sample(later, "straggler", 0) == 0
    late = {r: rank_sample(later, "push_lateness_seconds_sum", r) /
            rank_sample(later, "push_lateness_seconds_count", r) for r in (0, 1)}
    assert late[1] >= 0.1 and late[1] > 20 * late[0], late


def test_hostile_clients_hold_a_scrape_at_most_their_deadlines(metrics_job):
    # Served one at a time: the silent and the trickling client cost a deadline each,
    # the flood ends at the size bound; then the proper scrape is answered.
    assert metrics_job["during"][("tf_bps_server_rounds_total",)] > 0
    assert metrics_job["waited"] < 2 * DEADLINE_S + 3, metrics_job["waited"]
    assert metrics_job["strangers_left"] == 0


def test_a_metrics_port_that_is_taken_fails_the_server_naming_the_variable(procs):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, output = procs.run(
            [sys.executable, "-m", "tf_bps.control.server"],
            base_env(DMLC_ROLE="server", DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT="9",
                     DMLC_NUM_WORKER="1", DMLC_NUM_SERVER="1", BYTEPS_METRICS_PORT=port),
            timeout=30)
    assert status == 2, output
    assert (f"tf_bps server: BYTEPS_METRICS_PORT={port}: the server's Prometheus endpoint "
            "cannot listen there (Address already in use)") in output, output
