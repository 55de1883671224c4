"""The scheduler's one socket: a ZeroMQ ROUTER that every node reaches, and anyone else
who finds the port. It checks what arrives before the scheduler sees it (raw bytes,
extra frames, not JSON, not an object with a string "type": logged and dropped), opens
and seals messages (BYTEPS_ENCRYPT, sealing.py), and reads connections of no member of
the job at a bounded rate (throttle.py), so that no stranger can starve the job.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

import zmq

from tf_bps.control.throttle import OUTSIDER_MESSAGES_PER_S, OutsiderThrottle
from tf_bps.runtime.config import Config, is_local_address
from tf_bps.runtime.sealing import SchedulerSeals

log = logging.getLogger("tf_bps.scheduler")

# A node's messages are small JSON objects; anything larger is not one of ours, and
# ZeroMQ drops the connection that sends it before allocating it.
MAX_MESSAGE_BYTES = 64 * 1024
# A node has a few messages in flight at most; a flood of strangers' connections then
# holds this many each, not ZeroMQ's default of 1000.
MESSAGES_QUEUED_PER_PEER = 16
ZMQ_ZERO_COPY_RECV = 96  # zmq.h's number; pyzmq names no constant for it


class Inbox:
    """`is_member(identity)`: whether a connection is one of the job's (read at once)."""

    def __init__(self, config: Config, is_member: Callable[[bytes], bool]):
        root_uri, port = config.require_rendezvous()
        self._is_member = is_member
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 2000)
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.SNDHWM, MESSAGES_QUEUED_PER_PEER)
        self._socket.setsockopt(zmq.RCVHWM, MESSAGES_QUEUED_PER_PEER)
        # And each of those messages its own few bytes: received in place (ZeroMQ's
        # default), every queued message would pin the 8 KB read buffer it came in.
        self._socket.setsockopt(ZMQ_ZERO_COPY_RECV, 0)
        # Only the address the job knows the scheduler by, when it is this machine's.
        address = socket.gethostbyname(root_uri)
        local = is_local_address(address) and not config.listen_any
        self._socket.bind(f"tcp://{address if local else '*'}:{port}")
        self._outsiders = OutsiderThrottle()
        # BYTEPS_ENCRYPT: each registered connection's seal (sealing.py).
        self._seals = SchedulerSeals(config.job_token, config.encrypt)

    def send(self, identity: bytes, message: dict) -> None:
        message = self._seals.seal(identity, message)
        self._socket.send_multipart([identity, zmq.utils.jsonapi.dumps(message)])

    def refuse(self, identity: bytes, refusal: str) -> None:
        log.warning("refused a registration: %s", refusal)
        self.send(identity, {"type": "abort", "reason": refusal})

    def keep_seals_of(self, identities: set[bytes]) -> None:
        """Forgets the seals of every other connection (a generation formed)."""
        self._seals.keep_only(identities)

    def receive(self, timeout_s: float) -> tuple[bytes, dict] | None:
        """The next well-formed message, as sent, or None once `timeout_s` passes.
        Nothing that reaches the port may end the scheduler's loop."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:  # Polling only when nothing is queued: a flood queues plenty.
                parts = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                self._socket.poll(int(remaining * 1000) + 1)
                continue
            if not self._is_member(parts[0]) and self._outsiders.pay():
                log.warning("connections of no node of this job send more than %g messages "
                            "a second (a flood?): the scheduler reads them no faster",
                            OUTSIDER_MESSAGES_PER_S)
            try:
                identity, payload = parts
                message = zmq.utils.jsonapi.loads(payload)
                if isinstance(message, dict) and isinstance(message.get("type"), str):
                    message, refusal = self._seals.open(identity, message)
                    if refusal:
                        self.refuse(identity, refusal)
                    if message is not None:
                        return identity, message
                    continue
            except ValueError:  # Unpacking or decoding.
                pass
            log.warning("dropped a malformed message (%d part(s), %d bytes)", len(parts),
                        sum(len(p) for p in parts))

    def close(self) -> None:
        self._socket.close()
        self._context.term()
