"""The scheduler's challenges, kept nowhere: each is a time and a keyed hash of that
time and the connection it was issued to, under a secret only this scheduler holds
(as SYN cookies are). A registration brings its challenge back; the scheduler
recomputes the hash, so strangers flooding hellos cannot evict a real node's
challenge, because there is no table to evict it from.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

# How long a challenge stays good: a node registers right after its hello.
LIFETIME_S = 60.0


class Challenges:
    def __init__(self, clock=time.time):
        self._secret = secrets.token_bytes(32)
        self._clock = clock

    def _tag(self, identity: bytes, issued: int) -> str:
        message = identity + b"|" + str(issued).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def issue(self, identity: bytes) -> str:
        """A challenge for the connection `identity`."""
        issued = int(self._clock())
        return f"{issued}.{self._tag(identity, issued)}"

    def check(self, identity: bytes, nonce: object) -> str:
        """Why `nonce` is no good answer for `identity`'s registration; "" when it is."""
        text = nonce if isinstance(nonce, str) and len(nonce) <= 64 else ""
        issued, _, tag = text.partition(".")
        if not issued.isdigit() or not hmac.compare_digest(tag, self._tag(identity, int(issued))):
            return "answers no challenge this scheduler issued to it"
        age = self._clock() - int(issued)
        if not -1 <= age <= LIFETIME_S:
            return (f"answers a challenge issued {age:.0f} s ago; a registration must follow "
                    f"its hello within {LIFETIME_S:g} s")
        return ""
