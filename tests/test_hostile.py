"""Strangers and garbage at the job's ports: a job either completes with correct sums or
stops naming the cause; no process dies from what reached its port."""

import json
import socket
import threading
import time

import zmq
from conftest import finish, free_port


def _send_raw(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        time.sleep(0.05)


def _junk(port: int, stop: threading.Event) -> None:
    """Everything a careless or hostile peer might send the scheduler, over and over."""
    context = zmq.Context()
    registration = {"type": "register", "role": "worker", "host": "10.9.9.9", "pid": 4242,
                    "port": 0, "worker_id": 0, "local_rank": 0, "local_size": 1}
    messages = [
        [b"not json"], [b"[1, 2, 3]"], [b'{"type": 5}'], [b"{}", b"extra", b"parts"],
        [json.dumps({**registration, "worker_id": 7}).encode()],  # outside the job
        [json.dumps({**registration, "pid": "x"}).encode()],
        [json.dumps({**registration, "local_rank": 3}).encode()],
        [json.dumps({"type": "register", "role": "boss"}).encode()],
        [json.dumps({"type": "failure", "reason": "a stranger says stop"}).encode()],
        [b"x" * (1 << 20)],  # over the size limit
    ]
    try:
        while not stop.is_set():
            try:
                _send_raw(port, b"\x00\x01\x02\xff\xfe\x07")  # not even ZMTP
            except OSError:
                time.sleep(0.05)
                continue
            for parts in messages:
                dealer = context.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.connect(f"tcp://127.0.0.1:{port}")
                dealer.send_multipart(parts)
                time.sleep(0.01)
                dealer.close()
    finally:
        context.term()


def test_the_scheduler_survives_garbage_and_refuses_strangers(procs):
    port = free_port()
    job = procs.start_job_by_role(2, 1, "steady_sums.py", TEST_ROUNDS=150, DMLC_PS_ROOT_PORT=port)
    stop = threading.Event()
    sender = threading.Thread(target=_junk, args=(port, stop), daemon=True)
    sender.start()
    try:
        results = {name: finish(process, timeout=120) for name, process in job.items()}
    finally:
        stop.set()
        sender.join(timeout=10)
    for name, (status, output) in results.items():
        assert status == 0, (name, output)
    for rank in range(2):
        assert f"SUMS OK {rank}" in results[f"worker{rank}"][1]
    log = results["scheduler"][1]
    assert "dropped a malformed message" in log, log
    assert "refused a registration" in log and "DMLC_WORKER_ID=7" in log, log
