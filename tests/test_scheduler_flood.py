"""Thousands of stranger connections at the scheduler while a job trains: the
scheduler keeps at most 64 unproven ones per address and 1024 in all, reads each at a
bounded rate, and so still hears every member's heartbeat in time, with its memory
bounded.

While the flood reconnects as fast as it can, how far ZeroMQ's accepting runs ahead of
the doorman's cutting depends on the CPU each gets; so the exact bound is checked once
the flood stops coming back, and during it only that the scheduler holds far fewer
than the flood has."""

import contextlib
import resource
import selectors
import socket
import threading
import time

from harness import finish, tcp_sockets, wait_for_line

ZMTP_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00NULL" + b"\x00" * 16 + b"\x00" + b"\x00" * 31
_READY_BODY = b"\x05READY\x0bSocket-Type\x00\x00\x00\x06DEALER"
ZMTP_READY = b"\x04" + bytes([len(_READY_BODY)]) + _READY_BODY
HELLO = b'{"type": "hello"}'
HELLOS = (b"\x00" + bytes([len(HELLO)]) + HELLO) * 8
SOURCES = 120  # loopback addresses 127.0.1.x, the flood's
FLOOD = 6000
MAX_UNPROVEN = 1024  # doorman.MAX_CONNECTIONS


def _connect_many(port: int, count: int, connections: list, stop: threading.Event,
                  come_back: threading.Event) -> None:
    """`count` ZeroMQ-speaking connections (a DEALER's greeting), from SOURCES addresses,
    each sending hellos whenever it can, reconnecting when cut while `come_back` is set."""
    selector = selectors.DefaultSelector()

    def connect(index: int) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        # The port is chosen at connect, as for any client's connection, so the flood
        # never takes a port that a process bound (the other tests' listeners).
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_BIND_ADDRESS_NO_PORT, 1)
        sock.bind((f"127.0.1.{1 + index % SOURCES}", 0))
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))
        selector.register(sock, selectors.EVENT_WRITE, [index, ZMTP_GREETING + ZMTP_READY])
        connections.append(sock)

    for index in range(count):
        connect(index)
    while not stop.is_set():
        for key, _ in selector.select(timeout=0.1):
            index, pending = key.data
            try:
                sent = key.fileobj.send(pending or HELLOS)
                key.data[1] = pending[sent:] if pending else b""
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # Cut by the scheduler: come back.
                selector.unregister(key.fileobj)
                key.fileobj.close()
                connections.remove(key.fileobj)
                if come_back.is_set() and not stop.is_set():
                    connect(index)


def _established(port: int) -> tuple[int, int]:
    """Connections to the scheduler's port that the scheduler's side holds: the flood's
    (from 127.0.1.x) and the job's own (from 127.0.0.1).

    Only sockets whose local end is the scheduler's 127.0.0.1:port count: a client's end
    on another address may have the same port number, and would look like a member's."""
    ends = [remote for local, remote, state in tcp_sockets()
            if local == ("127.0.0.1", port) and state == "01"]
    strangers = sum(host.startswith("127.0.1.") for host, _ in ends)
    return strangers, len(ends) - strangers


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_thousands_of_strangers_do_not_stop_a_running_job(procs):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))
    job = procs.start_job_by_role(2, 1, "steady_sums.py", TEST_ROUNDS=400, TEST_ELEMENTS=1000,
                                  BYTEPS_JOB_TOKEN="a token long enough to be a secret",
                                  PS_HEARTBEAT_TIMEOUT=3)
    for rank in range(2):
        wait_for_line(job[f"worker{rank}"], "READY")
    port = int(procs.job_env["DMLC_PS_ROOT_PORT"])
    scheduler = job["scheduler"].pid
    rss_before = _rss_mb(scheduler)
    connections, stop, come_back = [], threading.Event(), threading.Event()
    come_back.set()
    flood = threading.Thread(target=_connect_many,
                             args=(port, FLOOD, connections, stop, come_back))
    flood.start()
    try:
        flooding, rss, until = [], 0.0, time.monotonic() + 3
        while time.monotonic() < until:
            time.sleep(0.5)
            flooding.append(_established(port)[0])
            rss = max(rss, _rss_mb(scheduler))
        come_back.clear()  # The survivors keep sending; the cut ones stay away.
        strangers, members = _settle(port)
        outputs = {}
        for name, process in job.items():
            status, outputs[name] = finish(process, timeout=120)
            assert status == 0, (name, outputs[name])
    finally:
        stop.set()
        flood.join(timeout=30)
        for sock in connections:
            sock.close()
    log = outputs["scheduler"]
    assert "heartbeat" not in log, log
    assert "cut a connection from 127.0.1." in log, log
    assert strangers <= MAX_UNPROVEN and members == 3, (strangers, members, flooding)
    assert sorted(flooding)[len(flooding) // 2] < FLOOD // 2, flooding
    assert rss - rss_before < 200, (rss_before, rss)


def _settle(port: int, timeout_s: float = 2.0) -> tuple[int, int]:
    """The scheduler's connections (strangers', members') once no more strangers come:
    the first count within the doorman's bound, or the last one after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (held := _established(port))[0] > MAX_UNPROVEN and time.monotonic() < deadline:
        time.sleep(0.1)
    return held
