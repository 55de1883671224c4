"""A stranger at the data plane's doors, written from the wire format alone
(custom_ops/wire/protocol.h, auth.h): frames, proofs, local socket names, and the
attacks tests/test_handshake_attacks.py runs against live servers and workers.

As a script it runs one attack and prints its findings as JSON (a test starts it as
another user, or as a worker of the job that knows the token):
  probe-local NAME...    connect to these local sockets (all of this host's tf_bps ones
                         if none is named), say nothing useful, send a shared-memory
                         frame and fences, and report what came back
  squat NAME...          bind the abstract names and answer everyone with a refusal
                         and an endless stream of fences, until killed
  shrinking-arena        register as worker DMLC_WORKER_ID, prove the token to the
                         server on its local socket, announce an arena the server
                         could see shrink, and report how the server answered
"""

from __future__ import annotations

import array
import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import time

# FrameHeader, field by field (static_assert: 72 bytes).
HEADER = struct.Struct("<IBBBBIIIBBHiIQQqQII")
MAGIC = 0x33535042
HELLO, ERROR, ARENA, PUSH_SHM, CHALLENGE, WELCOME, FENCE = 1, 5, 7, 8, 14, 15, 16
SEALED = 2  # FrameFlags::kFlagSealed
NONCE, DIGEST = 16, 32
CHALLENGE_BYTES = HEADER.size + NONCE


def frame(kind: int, payload: bytes = b"", rank: int = 0, flags: int = 0,
          length: int | None = None) -> bytes:
    size = len(payload) if length is None else length
    return HEADER.pack(MAGIC, kind, 0, 0, 0, rank, 0, 0, 0, flags, 0, -1, 0, 0, 0, 0, size,
                       0, 0) + payload


def proof(token: str, side: str, nonce: bytes, rank: int, sealed: bool) -> bytes:
    message = side.encode() + nonce + struct.pack("<I", rank) + bytes([int(sealed)])
    return hmac.new(token.encode(), message, hashlib.sha256).digest()


def server_socket_name(token: str, port: int) -> str:
    """The abstract name of the server's local socket (wire/socket.cc)."""
    digest = hmac.new(token.encode(), f"server socket|{port}".encode(), hashlib.sha256)
    return "tf_bps-" + digest.hexdigest()[:32]


def abstract(name: str) -> bytes:
    return b"\0" + name.encode()


def read_for(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """What the peer sends within `seconds`, and whether it closed the connection."""
    got, deadline = b"", time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return got, False
        except OSError:  # reset: closed with our bytes unread
            return got, True
        if not chunk:
            return got, True
        got += chunk
    return got, False


def read_exactly(sock: socket.socket, count: int, seconds: float = 5) -> bytes:
    got, deadline = b"", time.monotonic() + seconds
    while len(got) < count:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(count - len(got))
        if not chunk:
            raise ConnectionError(f"closed after {len(got)} of {count} bytes")
        got += chunk
    return got


def hello(challenge: bytes, token: str, rank: int, sealed: bool = False) -> bytes:
    nonce = os.urandom(NONCE)
    signed = proof(token, "worker", challenge[HEADER.size:], rank, sealed)
    return frame(HELLO, nonce + signed, rank=rank, flags=SEALED if sealed else 0)


def send_with_fd(sock: socket.socket, data: bytes, fd: int) -> None:
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def local_tf_bps_sockets() -> list[str]:
    """The abstract names of this host's tf_bps Unix sockets (/proc/net/unix shows
    every abstract name to every user)."""
    names = set()
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("@tf_bps-"):
            names.add(fields[7][1:])
    return sorted(names)


def probe_local(names: list[str]) -> dict:
    """Each local socket named (every tf_bps one if none is): what it says to us, and
    whether it takes shared memory and fences from us before any proof."""
    found = {}
    for name in names or local_tf_bps_sockets():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(abstract(name))
            except OSError as error:
                found[name] = {"connect": str(error)}
                continue
            memory = os.memfd_create("stranger")
            os.ftruncate(memory, 1 << 20)
            try:
                send_with_fd(sock, frame(ARENA, struct.pack("<IIQ", 0, 0, 1 << 20)), memory)
                sock.sendall(frame(FENCE) * 100)
            except OSError:
                pass
            os.close(memory)
            got, closed = read_for(sock, 2.0)
            found[name] = {"received": len(got), "closed": closed}
    return found


def squat(names: list[str]) -> None:
    """Binds `names` and answers each connection with a refusal, then fences forever."""
    listeners = []
    for name in names:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(abstract(name))
        listener.listen(16)
        listener.setblocking(False)
        listeners.append(listener)
    print(json.dumps({"squatting": names}), flush=True)
    connections = []
    while True:
        for listener in listeners:
            try:
                connection, _ = listener.accept()
                connection.setblocking(False)
                reason = b"a squatter refuses you"
                connection.sendall(frame(ERROR, reason))
                connections.append(connection)
            except BlockingIOError:
                pass
        for connection in list(connections):
            try:
                connection.send(frame(FENCE))
            except BlockingIOError:
                pass
            except OSError:
                connections.remove(connection)
        time.sleep(0.005)


def shrinking_arena() -> dict:
    """A worker of the job that knows the token offers the server memory it could
    shrink under the server's reads."""
    from tf_bps.runtime.config import Config
    from tf_bps.runtime.rendezvous import SchedulerLink

    config = Config.from_env()
    link = SchedulerLink(config)
    book = link.register("worker", worker_id=config.worker_id, local_rank=0, local_size=1,
                         local_merge="0", moves_lost_servers=False)
    rank = book["rank"]
    port = int(book["servers"][0].rsplit(":", 1)[1])
    report = {"rank": rank}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(abstract(server_socket_name(config.job_token, port)))
        challenge = read_exactly(sock, CHALLENGE_BYTES)
        sock.sendall(hello(challenge, config.job_token, rank))
        welcome = read_exactly(sock, HEADER.size + DIGEST)
        report["welcomed"] = HEADER.unpack(welcome[:HEADER.size])[1] == WELCOME
        memory = os.memfd_create("shrinking", os.MFD_ALLOW_SEALING)
        os.ftruncate(memory, 1 << 20)
        send_with_fd(sock, frame(ARENA, struct.pack("<IIQ", 0, 0, 1 << 20)), memory)
        os.ftruncate(memory, 0)  # what would fault a server that mapped it
        try:
            sock.sendall(frame(PUSH_SHM, struct.pack("<IIQQ", 0, 0, 0, 4096), rank=rank))
        except (BrokenPipeError, ConnectionResetError):
            # The server refused the arena, and hung up, before the push went out: it
            # checks the seals as the arena comes (read_for then finds it closed).
            pass
        got, closed = read_for(sock, 5.0)
        report.update(received=len(got), closed=closed)
    link.close(failure="the stranger is done")
    return report


if __name__ == "__main__":
    mode, names = sys.argv[1], sys.argv[2:]
    if mode == "squat":
        squat(names)
    else:
        found = probe_local(names) if mode == "probe-local" else shrinking_arena()
        print("FOUND " + json.dumps(found), flush=True)
