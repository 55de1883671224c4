"""Strangers at the data plane before any proof (README, "Strangers at the ports"): each
test is an attacker script (tests/workers/wire_stranger.py) against a live job of
scheduler, bps_server and workers. Attacks about other users of the host run as
nobody."""

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from harness import LAUNCH, WORKERS, base_env, finish, free_port, wait_for_line, worker_command
from wire_stranger import (
    CHALLENGE,
    CHALLENGE_BYTES,
    ERROR,
    HEADER,
    frame,
    hello,
    local_tf_bps_sockets,
    read_exactly,
    read_for,
    server_socket_name,
)

TOKEN = "a token long enough to be a secret"
STRANGER = WORKERS / "wire_stranger.py"
NOBODY = 65534


def _as_nobody():
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _python_for_nobody() -> str:
    """A Python another user may run (ours may live in root's home); the strangers that
    run as nobody need only its standard library."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and os.stat(candidate).st_mode & 0o001:
            return candidate
    pytest.skip("no Python that another user may run")


def _stranger(procs, mode: str, *args: str, env: dict | None = None, nobody: bool = False):
    """wire_stranger.py in `mode`, fed through stdin so that nobody need not read the
    checkout."""
    command = [_python_for_nobody() if nobody else sys.executable, "-", mode, *args]
    process = subprocess.Popen(command, stdin=open(STRANGER), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               env=env or base_env(), preexec_fn=_as_nobody if nobody else None)
    procs.started.append(process)
    return process


def _found(process) -> dict:
    status, output = finish(process, timeout=60)
    assert status == 0, output
    return json.loads(output.split("FOUND ", 1)[1].splitlines()[0])


def _sums_right(job: dict) -> dict[str, str]:
    outputs = {}
    for name, process in job.items():
        status, outputs[name] = finish(process, timeout=120)
        assert status == 0, (name, outputs[name])
    return outputs


def _merge_prefix(env: dict) -> str:
    """The local merge's socket names of generation 0 (tf_bps/runtime/core.py)."""
    where = f"local merge|127.0.0.1:{env['DMLC_PS_ROOT_PORT']}|0".encode()
    return f"tf_bps-{hmac.new(TOKEN.encode(), where, 'sha256').hexdigest()[:32]}-"


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_trickled_refusal_holds_no_door_and_a_stranger_learns_nothing(procs):
    # An encrypted job whose server starts before its (TCP) workers. A stranger answers
    # the challenge with a refusal's header and trickles its text a byte every 60 ms:
    # the server must cut it at once, not read its text while the workers wait. Four
    # more try hellos with a guessed proof, rank in and outside the job, sealing or not:
    # each hears nothing after the challenge (no rank range, no sealing setting).
    env = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(), DMLC_NUM_WORKER=2,
               DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN=TOKEN, BYTEPS_ENCRYPT=1,
               BYTEPS_ENABLE_IPC=0, TEST_ROUNDS=30)
    job = {"scheduler": procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **env)),
           "server": procs.start(LAUNCH, base_env(DMLC_ROLE="server", BYTEPS_LOG_LEVEL="INFO",
                                                  **env))}
    port = int(wait_for_line(job["server"], r"listening on port (\d+)").group(1))
    # The strangers connect first (the server accepts once every worker registered).
    cut_after, heard = [], {}

    def trickle(sock):
        challenge = read_exactly(sock, CHALLENGE_BYTES, seconds=60)
        assert HEADER.unpack(challenge[:HEADER.size])[1] == CHALLENGE
        sock.sendall(frame(ERROR, length=1024))
        started = time.monotonic()
        while time.monotonic() - started < 30:
            try:
                sock.send(b"x")
            except OSError:
                cut_after.append(time.monotonic() - started)
                return
            time.sleep(0.06)

    def guess(sock, rank, sealed):
        challenge = read_exactly(sock, CHALLENGE_BYTES, seconds=60)
        sock.sendall(hello(challenge, "a guess at the token", rank, sealed))
        heard[(rank, sealed)] = read_for(sock, 3.0)

    strangers = [(trickle, ())] + [(guess, (rank, sealed))
                                   for rank in (0, 99) for sealed in (False, True)]
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in strangers]
    threads = [threading.Thread(target=attack, args=(sock, *args), daemon=True)
               for (attack, args), sock in zip(strangers, sockets, strict=True)]
    for thread in threads:
        thread.start()
    for rank in range(2):
        job[f"worker{rank}"] = procs.start([*LAUNCH, *worker_command("steady_sums.py")],
                                           base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=rank, **env))
    outputs = _sums_right(job)
    for thread, sock in zip(threads, sockets, strict=True):
        thread.join(timeout=35)
        sock.close()
    assert cut_after and cut_after[0] < 3, cut_after
    assert heard == {case: (b"", True) for case in heard}, heard
    log = outputs["server"]
    assert "does not know this job's token" in log, log
    assert "server seals them" not in log and "outside this job" not in log, log


def test_other_users_reach_no_local_socket_and_peers_map_shared_memory_read_only(procs):
    # One host: two workers merging locally and a server, all on shared memory. Another
    # user finds every tf_bps socket of the host (/proc/net/unix shows them to anyone),
    # connects, and offers shared memory and fences: each is closed at once, unheard
    # and unanswered, and the server keeps no descriptor of it.
    env = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(), DMLC_NUM_WORKER=1,
               DMLC_NUM_SERVER=1, BYTEPS_LOCAL_SIZE=2, BYTEPS_LOCAL_MERGE=1,
               BYTEPS_JOB_TOKEN=TOKEN, TEST_ROUNDS=300, BYTEPS_LOG_LEVEL="INFO")
    job = {"scheduler": procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **env)),
           "server": procs.start(LAUNCH, base_env(DMLC_ROLE="server", **env)),
           "workers": procs.start([*LAUNCH, *worker_command("steady_sums.py")],
                                  base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=0, **env))}
    port = int(wait_for_line(job["server"], r"listening on port (\d+)").group(1))
    wait_for_line(job["workers"], "READY")
    time.sleep(1)  # a few rounds through shared memory
    server = job["server"].pid
    fds = _open_fds(server)
    # The server's socket, and any other of the job's (the workers' for their local
    # merge are closed once they are connected).
    ours = [server_socket_name(TOKEN, port)] + [
        name for name in local_tf_bps_sockets() if name.startswith(_merge_prefix(env))]
    probed = _found(_stranger(procs, "probe-local", *ours, nobody=True))
    assert probed[ours[0]] == {"received": 0, "closed": True}, probed
    assert all(seen.get("received", 0) == 0 for seen in probed.values()), probed
    assert _open_fds(server) <= fds
    # The server maps the workers' arenas for reading only, and they map its the same.
    maps = open(f"/proc/{server}/maps").read().splitlines()
    peers = [line for line in maps if "memfd:tf_bps." in line and f"tf_bps.{server} " not in line]
    assert peers and all(line.split()[1] == "r--s" for line in peers), peers
    outputs = _sums_right(job)
    assert outputs["workers"].count("SUMS OK") == 2, outputs["workers"]
    assert f"runs as uid {NOBODY}" in outputs["server"], outputs["server"]


def test_squatters_on_names_anyone_could_predict_cost_the_job_nothing(procs):
    # Before the job starts, another user binds the local-merge socket names that follow
    # from the scheduler's address alone, and answers whoever comes with a refusal and
    # endless fences. The job's names come from its token: it never meets the squatter.
    port = free_port()
    where = hashlib.sha256(f"127.0.0.1:{port}".encode()).hexdigest()[:16]
    names = [f"tf_bps-{where}-0-{rank}" for rank in range(2)] + \
        [f"tf_bps-server-{p}" for p in range(port - 2, port + 3)]
    squatter = _stranger(procs, "squat", *names, nobody=True)
    wait_for_line(squatter, "squatting")
    env = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=port, DMLC_NUM_WORKER=1,
               DMLC_NUM_SERVER=1, BYTEPS_LOCAL_SIZE=2, BYTEPS_LOCAL_MERGE=1,
               BYTEPS_JOB_TOKEN=TOKEN, TEST_ROUNDS=20, BYTEPS_OP_TIMEOUT=20)
    job = {"scheduler": procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **env)),
           "server": procs.start(LAUNCH, base_env(DMLC_ROLE="server", **env)),
           "workers": procs.start([*LAUNCH, *worker_command("steady_sums.py")],
                                  base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=0, **env))}
    start = time.monotonic()
    outputs = _sums_right(job)
    assert time.monotonic() - start < 60
    assert outputs["workers"].count("SUMS OK") == 2, outputs["workers"]
    assert squatter.poll() is None  # it squatted all along


def test_a_worker_offering_memory_it_could_shrink_is_refused_and_the_server_lives(procs):
    # A worker of the job (it knows the token) proves itself on the server's local
    # socket, then announces an arena that is no sealed memfd, shrinks it and points a
    # push into it: a server that mapped it would die of SIGBUS reading. The server
    # refuses the arena, drops that worker, and ends the job with a reason.
    env = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(), DMLC_NUM_WORKER=2,
               DMLC_NUM_SERVER=1, BYTEPS_JOB_TOKEN=TOKEN, TEST_ROUNDS=1000,
               BYTEPS_OP_TIMEOUT=20)
    job = {"scheduler": procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **env)),
           "server": procs.start(LAUNCH, base_env(DMLC_ROLE="server", **env)),
           "worker0": procs.start([*LAUNCH, *worker_command("steady_sums.py")],
                                  base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=0, **env))}
    stranger = _stranger(procs, "shrinking-arena",
                         env=base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=1, **env))
    report = _found(stranger)
    assert report["welcomed"] and report["closed"], report
    status, log = finish(job["server"], timeout=60)
    assert status >= 0, f"the server died of signal {-status}:\n{log}"
    assert "not shared memory sealed against resizing" in log, log
    for name in ("scheduler", "worker0"):
        finish(job[name], timeout=60)


if not hasattr(os, "memfd_create"):  # pragma: no cover
    pytestmark = pytest.mark.skip("needs memfd_create")
