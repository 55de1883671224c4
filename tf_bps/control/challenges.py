"""The scheduler's challenges: each is a time, a fresh random value and a keyed hash of
both and of the connection it was issued to, under a secret only this scheduler holds
(as SYN cookies are). A registration brings its challenge back; the scheduler
recomputes the hash, so strangers flooding hellos cannot evict a real node's
challenge, because there is no table of issued ones to evict it from.

The random value makes every registration's keys new (BYTEPS_ENCRYPT derives them from
the challenge and the node's nonce), and a challenge is good for one registration: the
scheduler remembers those answered with a proof of the token until they expire, so a
recorded registration replayed later is refused, not sealed for again.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

# How long a challenge stays good: a node registers right after its hello.
LIFETIME_S = 60.0
# Challenges answered with a proof within one lifetime. Only a node that knows the
# token adds one, with one registration each, so a job never comes near it; past it,
# registrations are refused until the oldest expire, never let in twice.
MAX_ANSWERED = 65536
# A challenge as this scheduler writes it is far shorter.
MAX_CHALLENGE_CHARS = 128


class Challenges:
    def __init__(self, clock=time.time):
        self._secret = secrets.token_bytes(32)
        self._clock = clock
        self._answered: dict[str, float] = {}  # challenge -> when it expires, oldest first

    def _tag(self, identity: bytes, issued: str, fresh: str) -> str:
        message = identity + f"|{issued}|{fresh}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def issue(self, identity: bytes) -> str:
        """A challenge for the connection `identity`, unlike any other."""
        issued, fresh = str(int(self._clock())), secrets.token_hex(16)
        return f"{issued}.{fresh}.{self._tag(identity, issued, fresh)}"

    def check(self, identity: bytes, challenge: object) -> str:
        """Why `challenge` is no good answer for `identity`'s registration; "" when it is
        one this scheduler issued to it, not expired (answered or not: see `answer`)."""
        text = challenge if isinstance(challenge, str) else ""
        parts = text.split(".") if len(text) <= MAX_CHALLENGE_CHARS else []
        if len(parts) != 3 or not parts[0].isdigit() or not hmac.compare_digest(
                parts[2], self._tag(identity, parts[0], parts[1])):
            return "answers no challenge this scheduler issued to it"
        age = self._clock() - int(parts[0])
        if not -1 <= age <= LIFETIME_S:
            return (f"answers a challenge issued {age:.0f} s ago; a registration must follow "
                    f"its hello within {LIFETIME_S:g} s")
        return ""

    def answer(self, challenge: str) -> str:
        """Spends a checked challenge; why it cannot be ("" when it could)."""
        now = self._clock()
        while self._answered:
            oldest, expires = next(iter(self._answered.items()))
            if expires > now:
                break
            del self._answered[oldest]
        if challenge in self._answered:
            return "answers a challenge already answered (a recorded registration, replayed?)"
        if len(self._answered) >= MAX_ANSWERED:
            return (f"comes after {MAX_ANSWERED} registrations within {LIFETIME_S:g} s; the "
                    "scheduler takes more once the oldest expire")
        self._answered[challenge] = int(challenge.split(".")[0]) + LIFETIME_S + 1
        return ""
