"""BYTEPS_ENCRYPT through real jobs: sums stay right over TCP and shared memory, the
gradients are not in the clear on the wire, a frame tampered with or replayed by a man
in the middle ends the job naming the worker (never a wrong sum), and nodes started
with different settings are told why they cannot talk."""

import json
import os
import socket
import struct
import subprocess

import pytest
from harness import LAUNCH, base_env, finish, free_port, wait_for_line, worker_command
from relays import Relay, recv_exact, zmtp_frame, zmtp_messages
from test_collectives import check_collectives

# The wire's layout (custom_ops/wire/protocol.h, auth.h, crypto.h).
HEADER_BYTES = 72
LENGTH_OFFSET = 56
TYPE_OFFSET = 4
PUSH = 3
HELLO_BYTES = HEADER_BYTES + 16 + 32
TAG_BYTES = 16
# 16 float32 ones in a row: what a worker's push of ones looks like in the clear.
ONES = struct.pack("<16f", *[1.0] * 16)


class DataManInTheMiddle(Relay):
    """Between a worker and its server: reads the worker's side frame by frame (headers
    are in the clear) and keeps what it saw; `mischief` "tamper" flips a bit in the
    payload of the worker's 20th push, "replay" sends that push twice."""

    def __init__(self, port: int, sealed: bool, mischief: str | None = None):
        self.sealed, self.mischief = sealed, mischief
        self.seen = bytearray()
        super().__init__(("127.0.0.2", port), ("127.0.0.1", port))

    def upstream(self, worker: socket.socket, server: socket.socket) -> None:
        tag = TAG_BYTES if self.sealed else 0
        pushes = 0
        server.sendall(recv_exact(worker, HELLO_BYTES))
        while True:
            start = recv_exact(worker, HEADER_BYTES + tag)
            length = struct.unpack_from("<Q", start, LENGTH_OFFSET)[0]
            frame = bytearray(start + recv_exact(worker, length + (tag if length else 0)))
            if len(self.seen) < (4 << 20):
                self.seen += frame
            pushes += frame[TYPE_OFFSET] == PUSH
            if pushes == 20 and frame[TYPE_OFFSET] == PUSH and length and self.mischief:
                if self.mischief == "tamper":
                    frame[HEADER_BYTES + tag + length // 2] ^= 0x10
                else:
                    server.sendall(frame)  # replayed below
                self.done_mischief.set()
            server.sendall(frame)


class ControlManInTheMiddle(Relay):
    """Between the scheduler and the node connecting through it: reads the scheduler's
    side as ZeroMQ frames (ZMTP 3), keeps the messages, and after the fifth slips in a
    forged one, a clear abort."""

    FORGED = json.dumps({"type": "abort", "reason": "forged by a man in the middle"}).encode()

    def __init__(self, port: int):
        self.messages = 0
        super().__init__(("127.0.0.2", port), ("127.0.0.1", port))

    def downstream(self, scheduler: socket.socket, node: socket.socket) -> None:
        for _ in zmtp_messages(scheduler, node):
            self.messages += 1
            if self.messages == 5:
                node.sendall(zmtp_frame(self.FORGED))
                self.done_mischief.set()


def _hosts_file(tmp_path) -> str:
    """An /etc/hosts in which "localhost" is the man in the middle's address."""
    path = tmp_path / "hosts"
    path.write_text("127.0.0.2 localhost\n")
    return str(path)


def _behind_the_man_in_the_middle(command: list[str], hosts: str) -> list[str]:
    """`command` in a mount namespace of its own that sees `hosts` as /etc/hosts."""
    return ["unshare", "-m", "--", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
            hosts, *command]


def _job_through_the_middle(procs, tmp_path, encrypt: bool, mischief: str | None = None):
    """One server advertised as "localhost" (127.0.0.1 to it and to worker 1); worker 0
    resolves that name to the man in the middle. TCP only (BYTEPS_ENABLE_IPC=0)."""
    env = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(), DMLC_NUM_WORKER=2,
               DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN="the job's secret", BYTEPS_ENABLE_IPC=0,
               BYTEPS_ENCRYPT=int(encrypt), TEST_ROUNDS=60, TEST_ELEMENTS=4096)
    job = {"scheduler": procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **env)),
           "server": procs.start(LAUNCH, base_env(DMLC_ROLE="server", DMLC_NODE_HOST="localhost",
                                                  BYTEPS_LOG_LEVEL="INFO", **env))}
    port = int(wait_for_line(job["server"], r"listening on port (\d+)").group(1))
    middle = DataManInTheMiddle(port, sealed=encrypt, mischief=mischief)
    hosts = _hosts_file(tmp_path)
    for rank in range(2):
        command = [*LAUNCH, *worker_command("steady_sums.py")]
        if rank == 0:
            command = _behind_the_man_in_the_middle(command, hosts)
        job[f"worker{rank}"] = procs.start(
            command, base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=rank, **env))
    return job, middle


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")


def _outputs(job: dict) -> dict[str, tuple[int, str]]:
    return {name: finish(process, timeout=120) for name, process in job.items()}


@needs_root
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypted", "clear"])
def test_what_a_man_in_the_middle_sees(procs, tmp_path, encrypt):
    # Worker 0's pushes hold ones at every step after the first; in the clear they show
    # on the wire, sealed they do not. The sums are right either way.
    job, middle = _job_through_the_middle(procs, tmp_path, encrypt)
    try:
        outputs = _outputs(job)
    finally:
        middle.close()
    for name, (status, output) in outputs.items():
        assert status == 0, (name, output)
    assert "SUMS OK 0" in outputs["worker0"][1] and "SUMS OK 1" in outputs["worker1"][1]
    assert len(middle.seen) > 60 * 4096, len(middle.seen)  # every push went through it
    assert (ONES in middle.seen) == (not encrypt)


@needs_root
@pytest.mark.parametrize("mischief", ["tamper", "replay"])
def test_a_frame_changed_on_the_way_ends_the_job_naming_the_worker(procs, tmp_path, mischief):
    job, middle = _job_through_the_middle(procs, tmp_path, True, mischief)
    try:
        outputs = _outputs(job)
    finally:
        middle.close()
    assert middle.done_mischief.is_set()
    everything = "\n".join(output for _, output in outputs.values())
    assert "WRONG" not in everything, everything  # no sum was made of the changed frame
    server = outputs["server"][1]
    assert "worker rank 0 (127.0.0.1:" in server and "does not authenticate" in server, server
    assert outputs["worker0"][0] != 0, outputs["worker0"][1]


@needs_root
@pytest.mark.parametrize("encrypt", [True, False], ids=["encrypted", "clear"])
def test_a_forged_scheduler_message(procs, tmp_path, encrypt):
    # Worker 0 reaches the scheduler through a man in the middle that slips a forged
    # abort into what the scheduler says. In the clear it ends the worker; sealed, the
    # worker drops it and the job completes with every sum right. In the clear, the rest
    # of the job stops once the scheduler finds worker 0 silent: a 3 s heartbeat timeout
    # (0.5 s heartbeats) instead of the default 10 s.
    port = free_port()
    env = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=port, DMLC_NUM_WORKER=2,
               DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN="the job's secret", BYTEPS_ENABLE_IPC=0,
               BYTEPS_ENCRYPT=int(encrypt), TEST_ROUNDS=250, TEST_ELEMENTS=4096,
               PS_HEARTBEAT_INTERVAL=0.5, PS_HEARTBEAT_TIMEOUT=3)
    middle = ControlManInTheMiddle(port)
    job = {"scheduler": procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **env)),
           "server": procs.start(LAUNCH, base_env(DMLC_ROLE="server", **env))}
    for rank in range(2):
        command = [*LAUNCH, *worker_command("steady_sums.py")]
        where = {}
        if rank == 0:
            command = _behind_the_man_in_the_middle(command, _hosts_file(tmp_path))
            where = {"DMLC_PS_ROOT_URI": "localhost"}
        job[f"worker{rank}"] = procs.start(
            command, base_env(**{**env, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": rank, **where}))
    try:
        outputs = _outputs(job)
    finally:
        middle.close()
    assert middle.done_mischief.is_set()
    status, output = outputs["worker0"]
    if encrypt:
        for name, (code, text) in outputs.items():
            assert code == 0, (name, text)
        assert "SUMS OK 0" in output and "does not authenticate" in output, output
    else:
        assert status != 0 and "forged by a man in the middle" in output, output


@pytest.mark.parametrize("odd_one", ["worker sealing", "server sealing", "worker in the clear"])
def test_nodes_started_with_different_settings_are_told_why(procs, odd_one):
    # The scheduler checks each registration first: a node whose BYTEPS_ENCRYPT is not
    # its own is refused saying which side seals (the servers check the workers again,
    # tests/cpp/sealed_frames_test.cc).
    node, setting = odd_one.split(" ", 1)
    env = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(), DMLC_NUM_WORKER=1,
               DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN="the job's secret", BYTEPS_FORCE_DISTRIBUTED=1,
               BYTEPS_ENCRYPT=int(setting == "in the clear"), TEST_ROUNDS=3)
    odd = {"BYTEPS_ENCRYPT": str(int(setting == "sealing"))}
    job = {"scheduler": procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **env)),
           "server": procs.start(LAUNCH, base_env(
               **{**env, "DMLC_ROLE": "server", **(odd if node == "server" else {})})),
           "worker": procs.start([*LAUNCH, *worker_command("steady_sums.py")], base_env(
               **{**env, "DMLC_ROLE": "worker", **(odd if node == "worker" else {})}))}
    status, output = finish(job[node], timeout=60)
    assert status != 0, output
    said = ("this node seals its control messages and the scheduler does not"
            if setting == "sealing" else
            "this node sends its control messages in the clear and the scheduler seals them")
    assert f"the scheduler refused this node: {said} (BYTEPS_ENCRYPT)" in output, output
    for name in job:
        procs.end(job[name])


def test_encryption_without_a_token_is_refused(procs):
    env = base_env(DMLC_ROLE="server", DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(),
                   DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=1, BYTEPS_ENCRYPT=1,
                   BYTEPS_FORCE_DISTRIBUTED=1)
    env.pop("BYTEPS_JOB_TOKEN", None)
    for role in ("server", "worker"):
        run = subprocess.run([*LAUNCH, *worker_command("steady_sums.py")] if role == "worker"
                             else LAUNCH, env={**env, "DMLC_ROLE": role}, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode != 0, (role, run.stdout, run.stderr)
        assert "BYTEPS_ENCRYPT=1 needs BYTEPS_JOB_TOKEN" in run.stdout + run.stderr, role


def test_every_collective_is_right_when_encrypted(procs, tmp_path):
    # Three workers, one of them over TCP and two over shared memory, small partitions:
    # many sealed frames of every kind, each collective checked against numpy.
    status, output = procs.launch(3, "collectives.py", num_servers=2, BYTEPS_ENCRYPT=1,
                                  BYTEPS_PARTITION_BYTES=4096, TEST_OUT=tmp_path,
                                  TEST_TCP_WORKERS="1", timeout=240)
    assert status == 0, output
    check_collectives(tmp_path, 3)


def test_a_sealed_control_message_opens_once_in_order_and_untouched():
    # tf_bps/runtime/sealing.py on both sides of one registration, in this process.
    from tf_bps.runtime.sealing import ControlSeal

    node = ControlSeal("the job's token", "challenge", "node nonce", "node")
    scheduler = ControlSeal("the job's token", "challenge", "node nonce", "scheduler")
    first, second, third = (node.seal({"type": "heartbeat", "n": n}) for n in range(3))
    assert "heartbeat" not in first["box"] and first["seq"] == 1
    assert scheduler.open(second) == {"type": "heartbeat", "n": 1}  # the first was lost
    assert scheduler.open(second) is None  # replayed
    assert scheduler.open(first) is None  # too late: older than one opened
    tampered = {**third, "box": third["box"][:-2] + ("00" if third["box"][-2:] != "00" else "01")}
    assert scheduler.open(tampered) is None
    assert scheduler.open({**third, "seq": 7}) is None  # moved to another number
    for seq in (2**64, 2**70, -1, True, "3", None):  # a stranger's numbers: dropped, no error
        assert scheduler.open({**third, "seq": seq}) is None
    assert scheduler.open(third) == {"type": "heartbeat", "n": 2}
    assert node.open(scheduler.seal({"type": "heartbeat_ack"})) == {"type": "heartbeat_ack"}
    stranger = ControlSeal("a guess", "challenge", "node nonce", "scheduler")
    assert stranger.open(node.seal({"type": "done"})) is None
    assert scheduler.open({"type": "abort", "reason": "in the clear"}) is None
