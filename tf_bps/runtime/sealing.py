"""Sealed control messages (BYTEPS_ENCRYPT): what the scheduler and a node say to each
other after a registration, encrypted and authenticated with keys of that registration
(custom_ops/wire/crypto.h, through the core's C API).

A sealed message travels as {"type": "sealed", "seq": n, "box": hex}: the JSON of the
message, sealed as number n of its direction. A receiver opens only numbers above the
last it opened, so a message ZeroMQ dropped is lost but none is replayed or reordered.
The registration itself carries its fields sealed the same way (as message 1), next to
the clear nonces and proof the scheduler needs to derive the keys without keeping any
state for a node that has not registered.
"""

from __future__ import annotations

import json
import logging

log = logging.getLogger("tf_bps.scheduler")

# Bounds a box before it is decoded (the scheduler's messages are far smaller), and a
# sequence number before it reaches the core (an unsigned 64-bit count there).
MAX_BOX_CHARS = 128 * 1024
MAX_SEQUENCE = 2**63


def _engine():
    from tf_bps.runtime.core import worker_engine  # The core, only where encryption is on.

    return worker_engine()


class ControlSeal:
    """One side of one registration: seals what it sends, opens what it receives."""

    def __init__(self, token: str, scheduler_nonce: str, node_nonce: str, side: str):
        to_scheduler, to_node = _engine().control_keys(token, scheduler_nonce, node_nonce)
        self._send_key, self._receive_key = ((to_scheduler, to_node) if side == "node"
                                             else (to_node, to_scheduler))
        self._sent = 0
        self._opened = 0

    def seal(self, message: dict) -> dict:
        self._sent += 1
        box = _engine().seal_message(self._send_key, self._sent, json.dumps(message).encode())
        return {"type": "sealed", "seq": self._sent, "box": box.hex()}

    def open(self, envelope: dict) -> dict | None:
        """The message in `envelope`, or None if it is not one this side can trust (not
        sealed, tampered with, replayed or older than one already opened)."""
        seq, box = envelope.get("seq"), envelope.get("box")
        if (envelope.get("type") not in ("sealed", "register") or not isinstance(seq, int)
                or isinstance(seq, bool) or not self._opened < seq < MAX_SEQUENCE
                or not isinstance(box, str)
                or len(box) > MAX_BOX_CHARS):
            return None
        try:
            clear = _engine().open_message(self._receive_key, seq, bytes.fromhex(box))
            message = json.loads(clear) if clear is not None else None
        except ValueError:
            return None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            return None
        self._opened = seq
        return message


class SchedulerSeals:
    """The scheduler's side: a seal for each connection that registered with a box that
    opens under the token (so never one for a stranger)."""

    def __init__(self, token: str, encrypt: bool):
        self._token, self._encrypt = token, encrypt
        self._seals: dict[bytes, ControlSeal] = {}

    def seal(self, identity: bytes, message: dict) -> dict:
        seal = self._seals.get(identity)
        return seal.seal(message) if seal is not None else message

    def open(self, identity: bytes, message: dict) -> tuple[dict | None, str]:
        """(the message `identity` sent, opened if sealed, or None to drop it; why the
        node is refused, or ""). A registration's fields are opened and its connection
        gets a new seal; a hello starts a registration, in the clear."""
        kind, sealing = message["type"], "box" in message
        if kind == "register" and sealing != self._encrypt:
            return None, ((
                "this node seals its control messages and the scheduler does not" if sealing
                else "this node sends its control messages in the clear and the scheduler "
                     "seals them") + " (BYTEPS_ENCRYPT): start every node of the job with the "
                "same setting")
        if kind == "hello":
            self._seals.pop(identity, None)
            return message, ""
        if not self._encrypt:
            return message, ""
        if kind == "register":
            return self._register(identity, message)
        seal = self._seals.get(identity)
        opened = seal.open(message) if seal is not None else None
        if opened is None and seal is not None:
            log.warning("dropped a control message that does not authenticate (BYTEPS_ENCRYPT)")
        return opened, ""

    def _register(self, identity: bytes, message: dict) -> tuple[dict | None, str]:
        nonce, node_nonce = message.get("nonce"), message.get("node_nonce")
        if not all(isinstance(text, str) and len(text) <= 64 for text in (nonce, node_nonce)):
            return None, ""
        seal = ControlSeal(self._token, nonce, node_nonce, "scheduler")
        fields = seal.open(message)
        if fields is None or fields["type"] != "register":
            return None, "its registration does not open with this job's token (BYTEPS_JOB_TOKEN)"
        self._seals[identity] = seal
        return {**fields, "nonce": nonce, "proof": message.get("proof")}, ""

    def keep_only(self, identities: set[bytes]) -> None:
        """Forgets the seals of connections no longer in the job."""
        self._seals = {i: seal for i, seal in self._seals.items() if i in identities}
