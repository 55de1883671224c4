"""Men in the middle for the tests: a TCP relay whose two directions a test may
override, and ZeroMQ's framing (ZMTP 3) for relays that read the control plane."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator


def recv_exact(sock: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return bytes(data)


def zmtp_frame(body: bytes) -> bytes:
    """One ZMTP 3 message frame (the last of its message)."""
    if len(body) < 256:
        return bytes([0x00, len(body)]) + body
    return bytes([0x02]) + len(body).to_bytes(8, "big") + body


def zmtp_messages(src: socket.socket, dst: socket.socket,
                  lock: threading.Lock | None = None) -> Iterator[bytes]:
    """Relays a ZMTP 3 stream from `src` to `dst` (a 64-byte greeting, then frames:
    flags, a 1- or 8-byte size, the body), yielding each message frame's body once it is
    relayed. `lock` is held around each frame sent, for a relay that injects frames."""
    greeting = 64  # passed on as it comes: each side waits for parts of the other's
    while greeting:
        chunk = src.recv(greeting)
        if not chunk:
            return
        dst.sendall(chunk)
        greeting -= len(chunk)
    while True:
        flags = recv_exact(src, 1)
        size_bytes = recv_exact(src, 8 if flags[0] & 0x02 else 1)
        body = recv_exact(src, int.from_bytes(size_bytes, "big"))
        with lock or threading.Lock():
            dst.sendall(flags + size_bytes + body)
        if not flags[0] & 0x04:  # not a command (READY, PING)
            yield body


class Relay:
    """Listens on `listen` (host, port) and relays each connection to `target`, once
    that listens (within 30 s): what the connecting side sends through
    `upstream(src, dst)`, the answers through `downstream(src, dst)`; both copy bytes
    as they come unless a subclass reads them otherwise."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]):
        self.target = target
        self.done_mischief = threading.Event()
        self.listener = socket.create_server(listen)
        self.listener.settimeout(0.5)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
        self.listener.close()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                near, _ = self.listener.accept()
            except TimeoutError:
                continue
            far = self._connect()
            if far is None:
                near.close()
                continue
            for sock in (near, far):
                sock.settimeout(None)
            for relay, args in ((self.upstream, (near, far)), (self.downstream, (far, near))):
                thread = threading.Thread(target=self._guarded, args=(relay, *args), daemon=True)
                thread.start()
                self.threads.append(thread)

    def _connect(self) -> socket.socket | None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                return socket.create_connection(self.target, timeout=5)
            except OSError:
                time.sleep(0.1)
        return None

    @staticmethod
    def _guarded(relay, src: socket.socket, dst: socket.socket) -> None:
        try:
            relay(src, dst)
        except OSError:
            pass
        dst.close()

    def upstream(self, src: socket.socket, dst: socket.socket) -> None:
        while chunk := src.recv(1 << 16):
            dst.sendall(chunk)

    downstream = upstream
