"""Attacks on the scheduler's control plane, through real jobs: a man in the middle that
records a node's registration and replays it, or slips a hello into a member's
connection; strangers who say hello to learn a proof; a fake scheduler that registers a
server and then sends only garbage; tokens too short to keep a job's secret."""

import hashlib
import hmac
import json
import socket
import subprocess
import sys
import threading
import time

import pytest
import zmq
from harness import LAUNCH, base_env, finish, free_port, worker_command
from relays import Relay, zmtp_frame, zmtp_messages

TOKEN = "the job's secret, long enough"


class ZmtpProxy(Relay):
    """Listens on 127.0.0.1:`port`, relays one node's connection to the scheduler at
    127.0.0.1:`scheduler_port` and reads both ways as ZMTP 3 (relays.zmtp_messages). It
    keeps the node's registration and every message the scheduler sends, and once the
    scheduler has sent `after` messages, sends `mischief(proxy)`'s bytes to the
    scheduler as the node's."""

    def __init__(self, port: int, scheduler_port: int, after: int, mischief):
        self.registration: bytes | None = None
        self.sent_down: list[bytes] = []
        self._after, self._mischief = after, mischief
        self._to_scheduler = threading.Lock()  # whole frames only, never interleaved
        super().__init__(("127.0.0.1", port), ("127.0.0.1", scheduler_port))

    def upstream(self, node: socket.socket, scheduler: socket.socket) -> None:
        for body in zmtp_messages(node, scheduler, self._to_scheduler):
            if self.registration is None and b'"register"' in body:
                self.registration = body

    def downstream(self, scheduler: socket.socket, node: socket.socket) -> None:
        for body in zmtp_messages(scheduler, node):
            self.sent_down.append(body)
            if len(self.sent_down) == self._after and self.registration is not None:
                with self._to_scheduler:
                    scheduler.sendall(self._mischief(self))
                self.done_mischief.set()

    def sealed_sequences(self) -> list[int]:
        messages = [json.loads(body) for body in self.sent_down]
        return [m["seq"] for m in messages if m.get("type") == "sealed"]


def _replay_registration(proxy: ZmtpProxy) -> bytes:
    return zmtp_frame(proxy.registration)


def _clear_hello(proxy: ZmtpProxy) -> bytes:
    return zmtp_frame(json.dumps({"type": "hello", "nonce": "0" * 32}).encode())


def _encrypted_job(procs, victim: str, mischief):
    """Two workers and a server, sealed; `victim` (server or worker0) reaches the
    scheduler through a ZmtpProxy doing `mischief` after the scheduler's sixth message
    to it (its book has come, the job runs). 0.2 s heartbeats, a 3 s timeout: a node
    whose scheduler's messages stop opening fails within the job's time."""
    port, proxy_port = free_port(), free_port()
    env = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=port, DMLC_NUM_WORKER=2,
               DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN=TOKEN, BYTEPS_ENCRYPT=1,
               TEST_ROUNDS=300, TEST_ELEMENTS=4096, PS_HEARTBEAT_INTERVAL=0.2,
               PS_HEARTBEAT_TIMEOUT=3)
    proxy = ZmtpProxy(proxy_port, port, 6, mischief)
    through = {"DMLC_PS_ROOT_PORT": proxy_port}
    job = {"scheduler": procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **env)),
           "server": procs.start(LAUNCH, base_env(**{**env, "DMLC_ROLE": "server", **(
               through if victim == "server" else {})}))}
    for rank in range(2):
        job[f"worker{rank}"] = procs.start(
            [*LAUNCH, *worker_command("steady_sums.py")],
            base_env(**{**env, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": rank,
                        **(through if victim == f"worker{rank}" else {})}))
    return job, proxy


def _outputs(job: dict) -> dict[str, tuple[int, str]]:
    return {name: finish(process, timeout=120) for name, process in job.items()}


def _completed(outputs: dict[str, tuple[int, str]]) -> None:
    for name, (status, output) in outputs.items():
        assert status == 0, (name, output)
    for rank in range(2):
        assert f"SUMS OK {rank}" in outputs[f"worker{rank}"][1], outputs[f"worker{rank}"]


def _answers_to(port: int, payload: bytes, wait_s: float = 2.0) -> list[dict]:
    """What the scheduler at `port` says to a new connection that sends `payload`."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(payload)
        answers, deadline = [], time.monotonic() + wait_s
        while dealer.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            answers.append(json.loads(dealer.recv()))
        return answers
    finally:
        dealer.close()
        context.term()


@pytest.mark.parametrize("victim", ["server", "worker0"])
def test_a_replayed_registration_gets_no_keys_and_resets_no_seal(procs, victim):
    # The victim's registration, recorded on its way, is replayed inside its own
    # connection while the job runs: the scheduler must not start its seal over (a
    # sealed message numbered again is a key and nonce used twice). Replayed from a new
    # connection, it must get no sealed answer either (that answer would be sealed with
    # the victim's keys, numbered 1 again).
    job, proxy = _encrypted_job(procs, victim, _replay_registration)
    try:
        assert proxy.done_mischief.wait(timeout=90), proxy.sent_down
        strangers = _answers_to(proxy.target[1], proxy.registration)
        outputs = _outputs(job)
    finally:
        proxy.close()
    seqs = proxy.sealed_sequences()
    assert len(seqs) > 10 and len(set(seqs)) == len(seqs), seqs
    assert all(answer.get("type") != "sealed" for answer in strangers), strangers
    _completed(outputs)
    assert "already answered" in outputs["scheduler"][1], outputs["scheduler"]


def test_a_clear_hello_slipped_into_a_members_connection_keeps_its_seal(procs):
    # A hello starts no registration of a member that has one: the scheduler keeps
    # sealing what it says to the worker, which drops the clear challenge and goes on.
    job, proxy = _encrypted_job(procs, "worker0", _clear_hello)
    try:
        assert proxy.done_mischief.wait(timeout=90), proxy.sent_down
        outputs = _outputs(job)
    finally:
        proxy.close()
    seqs = proxy.sealed_sequences()
    assert len(seqs) > 10 and len(set(seqs)) == len(seqs), seqs
    _completed(outputs)
    assert "does not authenticate" in outputs["worker0"][1], outputs["worker0"]


def _proof(side: str, text: str, token: str = TOKEN) -> str:
    return hmac.new(token.encode(), f"{side}|{text}".encode(), hashlib.sha256).hexdigest()


def test_a_stranger_learns_nothing_before_it_proves_the_token(procs):
    # A hello gets a challenge and no proof (once, the scheduler signed the stranger's
    # nonce: an oracle for anyone guessing the token); a registration without the
    # token's proof, whatever it claims, hears "refused" and nothing else, in the clear.
    port = free_port()
    scheduler = procs.start(LAUNCH, base_env(
        DMLC_ROLE="scheduler", DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=port,
        DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN=TOKEN, BYTEPS_ENCRYPT=1,
        BYTEPS_OP_TIMEOUT=8))
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send_json({"type": "hello", "nonce": "0" * 32})
        assert dealer.poll(30000), "no challenge"
        challenge = dealer.recv_json()
        assert challenge["type"] == "challenge" and set(challenge) == {"type", "nonce"}, \
            challenge
        nonce = challenge["nonce"]
        wrong = {"type": "register", "role": "worker", "host": "127.0.0.1", "pid": 7,
                 "worker_id": 0, "local_rank": 0, "local_size": 1, "nonce": nonce,
                 "node_nonce": "1" * 32, "proof": _proof("node", f"{nonce}|{'1' * 32}",
                                                         "a guess, not the token")}
        for registration in (wrong, {**wrong, "box": "00", "seq": 1}, {"type": "register"}):
            dealer.send_json(registration)
            assert dealer.poll(5000), registration
            assert dealer.recv_json() == {"type": "abort", "reason": "refused"}, registration
    finally:
        dealer.close()
        context.term()
    status, log = finish(scheduler, timeout=60)
    assert "does not prove this job's token" in log, log
    assert "in the clear and the scheduler seals" not in log, log  # Told after a proof only.


@pytest.mark.parametrize("role", ["scheduler", "server", "worker"])
def test_a_short_token_is_refused_unless_allowed(procs, role):
    env = base_env(DMLC_ROLE=role, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(),
                   DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN="fifteen chars!!")
    command = [*LAUNCH, *worker_command("steady_sums.py")] if role == "worker" else LAUNCH
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert "BYTEPS_JOB_TOKEN has 15 character(s): it needs at least 16" in said, said
    assert "BYTEPS_ALLOW_SHORT_TOKEN=1" in said and "fifteen" not in said, said


def test_a_short_token_works_when_allowed(procs):
    job = procs.start_job_by_role(1, 1, "steady_sums.py", TEST_ROUNDS=3,
                                  BYTEPS_JOB_TOKEN="short", BYTEPS_ALLOW_SHORT_TOKEN=1,
                                  BYTEPS_FORCE_DISTRIBUTED=1)
    for name, process in job.items():
        status, output = finish(process, timeout=120)
        assert status == 0, (name, output)


def _fake_scheduler(port: int, stop: threading.Event) -> None:
    """Registers one server as the scheduler would (either protocol: with the proof in
    its challenge for a hello that carries a nonce, with "registered" for a
    registration that carries the node's), then sends only garbage."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://127.0.0.1:{port}")
    book = {"type": "book", "server_id": 0, "num_workers": 1, "servers": ["127.0.0.1:1"],
            "merge_groups": [0], "workers": ["127.0.0.1"], "generation": 0}
    node = None
    try:
        while not stop.is_set():
            if router.poll(100):
                node, raw = router.recv_multipart()
                message = json.loads(raw)
                if message["type"] == "hello":
                    challenge = {"type": "challenge", "nonce": "c" * 32}
                    if "nonce" in message:
                        challenge["proof"] = _proof("scheduler", message["nonce"])
                    router.send_multipart([node, json.dumps(challenge).encode()])
                elif message["type"] == "register":
                    if "node_nonce" in message:
                        said = f"{message['nonce']}|{message['node_nonce']}"
                        router.send_multipart([node, json.dumps({
                            "type": "registered", "proof": _proof("scheduler", said)}).encode()])
                    router.send_multipart([node, json.dumps(book).encode()])
            elif node is not None:
                for garbage in (b"not json", b"{}", b'{"type": ""}', b"[1, 2]"):
                    router.send_multipart([node, garbage])
    finally:
        router.close()
        context.term()


def test_garbage_from_the_scheduler_is_not_hearing_from_it(procs):
    # After its registration the server hears only garbage where the scheduler's
    # answers should be: that is silence, so it fails at PS_HEARTBEAT_TIMEOUT.
    port = free_port()
    stop = threading.Event()
    fake = threading.Thread(target=_fake_scheduler, args=(port, stop), daemon=True)
    fake.start()
    try:
        started = time.monotonic()
        server = procs.start(LAUNCH, base_env(
            DMLC_ROLE="server", DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=port,
            DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN=TOKEN,
            PS_HEARTBEAT_INTERVAL=0.5, PS_HEARTBEAT_TIMEOUT=3))
        status, output = finish(server, timeout=15)
        took = time.monotonic() - started
    finally:
        stop.set()
        fake.join(timeout=5)
    assert status != 0 and "PS_HEARTBEAT_TIMEOUT" in output, output
    assert "has not answered for" in output and took < 12, (took, output)


def test_a_members_text_reaches_the_log_escaped(procs):
    # A worker of the job (it knows the token) reports a failure whose reason would forge
    # log lines and drive the terminal: the scheduler's log quotes it on one line.
    env = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(), DMLC_NUM_WORKER=2,
               DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN=TOKEN, TEST_ROUNDS=1000)
    job = {"scheduler": procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **env)),
           "server": procs.start(LAUNCH, base_env(DMLC_ROLE="server", **env)),
           "worker0": procs.start([*LAUNCH, *worker_command("steady_sums.py")],
                                  base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=0, **env))}
    forged = "it broke\n[2026-11-27 12:00:00.000 tf_bps scheduler on vm INFO] job complete\x1b[2J"
    reporter = procs.start([sys.executable, "-c", (
        "import sys\n"
        "from tf_bps.runtime.config import Config\n"
        "from tf_bps.runtime.rendezvous import SchedulerLink\n"
        "link = SchedulerLink(Config.from_env())\n"
        "link.register('worker', worker_id=1, local_rank=0, local_size=1, local_merge='0',\n"
        "              moves_lost_servers=False)\n"
        "link.close(failure=sys.argv[1])\n"), forged],
        base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=1, **env))
    finish(reporter, timeout=60)
    status, log = finish(job["scheduler"], timeout=60)
    assert status != 0, log
    assert "it broke\\n[2026-11-27" in log and "\\x1b[2J" in log, log
    assert chr(27) not in log, log  # no terminal control of the stranger's choosing
    assert not any(line.startswith("[2026-11-27 12:00") for line in log.splitlines()), log
    for name in ("server", "worker0"):
        finish(job[name], timeout=60)
