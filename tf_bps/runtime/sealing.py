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

# Bounds a box before it is decoded (the scheduler's messages are far smaller).
MAX_BOX_CHARS = 128 * 1024


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
                or isinstance(seq, bool) or seq <= self._opened or not isinstance(box, str)
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
