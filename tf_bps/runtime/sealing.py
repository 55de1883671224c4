"""Sealed control messages (BYTEPS_ENCRYPT): what the scheduler and a node say to each
other after a registration, encrypted and authenticated with keys of that registration
(custom_ops/wire/crypto.h, through the core's C API).

A sealed message travels as {"type": "sealed", "seq": n, "box": hex}: the JSON of the
message, sealed as number n of its direction. A receiver opens only numbers above the
last it opened, so a message ZeroMQ dropped is lost but none is replayed or reordered.
The registration itself carries its fields sealed the same way (as message 1), next to
the clear nonces and proof the scheduler needs to derive the keys without keeping any
state for a node that has not registered. Its keys come from the scheduler's challenge,
fresh and answered once (control/challenges.py), and the node's nonce: no two
registrations share them.
"""

from __future__ import annotations

import json

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
    """The scheduler's side: the connections whose registration proved the token, each
    with its seal (None in the clear). The scheduler (control/inbox.py) adds one only
    after the registration's challenge and proof check, from keys of that registration
    alone; a connection that registers again gets a new seal, never an old one's counters
    restarted. A hello or any other message changes nothing here."""

    # More connections than any job has; past it the oldest is forgotten.
    MAX_CONNECTIONS = 65536

    def __init__(self, token: str, encrypt: bool):
        self._token, self._encrypt = token, encrypt
        self._seals: dict[bytes, ControlSeal | None] = {}

    def proven(self, identity: bytes) -> bool:
        return identity in self._seals

    def seal(self, identity: bytes, message: dict) -> dict:
        seal = self._seals.get(identity)
        return seal.seal(message) if seal is not None else message

    def open(self, identity: bytes, message: dict) -> dict | None:
        """The message `identity` sent, opened when sealing, or None to drop it: with
        BYTEPS_ENCRYPT, anything that does not open under its connection's seal."""
        if not self._encrypt:
            return message
        seal = self._seals.get(identity)
        return seal.open(message) if seal is not None else None

    def new_seal(self, challenge: str, node_nonce: str) -> ControlSeal | None:
        """The scheduler's side of a registration's keys; None in the clear."""
        return ControlSeal(self._token, challenge, node_nonce, "scheduler") if self._encrypt \
            else None

    def keep(self, identity: bytes, seal: ControlSeal | None) -> None:
        """`identity` proved the token; `seal` is its registration's."""
        self._seals.pop(identity, None)
        if len(self._seals) >= self.MAX_CONNECTIONS:
            del self._seals[next(iter(self._seals))]
        self._seals[identity] = seal

    def forget(self, identity: bytes) -> None:
        self._seals.pop(identity, None)

    def keep_only(self, identities: set[bytes]) -> None:
        """Forgets the seals of connections no longer in the job."""
        self._seals = {i: seal for i, seal in self._seals.items() if i in identities}
