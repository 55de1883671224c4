"""How fast the scheduler reads messages from connections of no node of the job.

Strangers can send hellos as fast as their machines allow; answering each costs the
scheduler two keyed hashes and a send, and on a small machine a flood would take a
core from the training job. So messages from outsiders (strangers, and nodes not yet
registered) are read at a bounded rate: past it, the scheduler pauses. ZeroMQ queues a
few messages per connection and then stops reading that connection, so TCP pushes back
on the senders, and since it serves connections in turn, a real node's hello waits one
turn of the connections at most (they are bounded: doorman.py), however much the others
send. Each outsider connection also has a budget of its own: what it sends past that is
dropped unread, so that no single connection takes the answers meant for the others.
"""

from __future__ import annotations

import time
from collections import OrderedDict

# Outsider messages read per second, and how many may come at once: a job's nodes need
# two each to register (hello, registration), so a thousand nodes start within a second;
# and ZeroMQ reads connections in turn, so with at most doorman.MAX_CONNECTIONS of them a
# member's message waits a fraction of a second behind the strangers' at most.
OUTSIDER_MESSAGES_PER_S = 5000.0
OUTSIDER_BURST = 2000.0
MIN_PAUSE_S = 0.02
# While outsiders are held back, the operator hears of it this often.
WARN_EVERY_S = 30.0


class OutsiderThrottle:
    """A token bucket: `pay` says how long to pause when there is no token."""

    def __init__(self, rate: float = OUTSIDER_MESSAGES_PER_S, burst: float = OUTSIDER_BURST):
        self._rate, self._burst = rate, burst
        self._tokens, self._at = burst, time.monotonic()
        self._warned_at = -WARN_EVERY_S

    def pay(self) -> tuple[float, bool]:
        """Takes a token: (seconds to pause before reading on, 0 if none; whether the
        pause is news for the operator, the first in WARN_EVERY_S)."""
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0, False
        # A pause long enough to read a batch after it: a pause per message would cost
        # more than the message.
        pause = max(-self._tokens / self._rate, MIN_PAUSE_S)
        if now - self._warned_at < WARN_EVERY_S:
            return pause, False
        self._warned_at = now
        return pause, True


# Warnings about one source's refused or malformed messages: one this often at most,
# and the sources remembered at once (a flood from many addresses forgets the oldest).
SOURCE_WARN_EVERY_S = 10.0
MAX_SOURCES = 1024


class SourceWarnings:
    """Rate-limits the scheduler's warnings per source address, so that no peer can fill
    its log; what is held back is counted and told with the source's next warning."""

    def __init__(self, every_s: float = SOURCE_WARN_EVERY_S, sources: int = MAX_SOURCES):
        self._every_s, self._sources = every_s, sources
        self._last: dict[str, tuple[float, int]] = {}  # source -> (warned at, held back)

    def allow(self, source: str) -> int | None:
        """None: hold this warning back; else how many were held back since the last."""
        now = time.monotonic()
        warned_at, held = self._last.pop(source, (-self._every_s, 0))
        if now - warned_at < self._every_s:
            self._last[source] = (warned_at, held + 1)
            return None
        if len(self._last) >= self._sources:
            del self._last[next(iter(self._last))]
        self._last[source] = (now, 0)
        return held


# What one outsider connection may have read per second, and at once: a node needs two
# messages to register, and says hello again now and then while no challenge comes.
PER_CONNECTION_PER_S = 2.0
PER_CONNECTION_BURST = 8.0
# Connections whose budgets are remembered (the least recently heard are forgotten).
MAX_BUDGETS = 4096


class ConnectionBudgets:
    """A token bucket per outsider connection (by ZeroMQ identity)."""

    def __init__(self, rate: float = PER_CONNECTION_PER_S, burst: float = PER_CONNECTION_BURST,
                 connections: int = MAX_BUDGETS):
        self._rate, self._burst, self._connections = rate, burst, connections
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()

    def allow(self, identity: bytes) -> bool:
        """Whether `identity`'s next message may be read (taking from its budget)."""
        now = time.monotonic()
        tokens, at = self._buckets.pop(identity, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if len(self._buckets) >= self._connections:
            self._buckets.popitem(last=False)
        self._buckets[identity] = (tokens - 1.0 if tokens >= 1.0 else tokens, now)
        return tokens >= 1.0
