"""Bounds the scheduler's connections that have not proven the job's token: at most
MAX_PER_SOURCE from one address and MAX_CONNECTIONS in all. ZeroMQ accepts every
connection itself and says nothing of who is behind it, so a socket monitor reports each
accepted descriptor; the doorman looks up its peer and, past a bound, shuts a connection
down (ZeroMQ then drops it with whatever it queued).

Which one: a newcomer takes the place of the oldest unproven connection (of its address,
or of all when the scheduler is full) that has had STALE_S to register and has not; if
none has, the newcomer is cut. So strangers that connect and never prove anything,
however many, keep no node out for longer than STALE_S, and a node has that long to
register once in. A connection that proved the token (the inbox vouches for it, by the
descriptor its registration came on) no longer counts and is never cut.

With these bounds, and ZeroMQ's few queued messages per connection (inbox.py), the
memory strangers can make the scheduler hold is bounded, and a member's message waits at
most one turn of MAX_CONNECTIONS connections (ZeroMQ reads connections in turn).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from tf_bps.control.throttle import SourceWarnings

log = logging.getLogger("tf_bps.scheduler")

# A host runs a few of the job's processes (its workers, a server, a launcher), each
# proven within moments of connecting; more unproven ones than this at once from one
# address are no host of the job.
MAX_PER_SOURCE = 64
MAX_CONNECTIONS = 1024
# How long an unproven connection keeps its place against newcomers.
STALE_S = 5.0
EVENTS_PER_DRAIN = 512


@dataclass
class _Unproven:
    peer: tuple  # (address, port)
    since: float


class Doorman:
    def __init__(self, router: zmq.Socket, per_source: int = MAX_PER_SOURCE,
                 total: int = MAX_CONNECTIONS):
        self._monitor = router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._per_source, self._total = per_source, total
        # Unproven connections by descriptor, oldest first, in all and by address.
        self._unproven: dict[int, _Unproven] = {}
        self._by_source: dict[str, dict[int, _Unproven]] = {}
        self._warnings = SourceWarnings()

    @property
    def monitor(self) -> zmq.Socket:
        """Readable when there is news: poll it with the router."""
        return self._monitor

    def drain(self) -> None:
        """Takes the monitor's news, a bounded batch at a time."""
        for _ in range(EVENTS_PER_DRAIN):
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._accepted(fd)
            else:
                self.vouch(fd)  # Gone: it counts no more either.

    def vouch(self, fd: int) -> None:
        """The connection on descriptor `fd` proved the token: it counts no more."""
        known = self._unproven.pop(fd, None)
        if known is not None:
            mine = self._by_source[known.peer[0]]
            del mine[fd]
            if not mine:
                del self._by_source[known.peer[0]]

    def _accepted(self, fd: int) -> None:
        # The descriptor is ZeroMQ's: a duplicate of it tells the peer, and shutting that
        # down ends the connection for ZeroMQ too. Events are read in order, so a
        # descriptor reused since is that of a newer connection, whose own event comes.
        peer = _peer(fd)
        if peer is None:
            return  # Gone already.
        source = peer[0]
        mine = self._by_source.get(source, {})
        room = True
        if len(mine) >= self._per_source:
            why = f"{source} has {self._per_source} connections that proved nothing yet"
            room = self._make_room(mine)
        elif len(self._unproven) >= self._total:
            why = f"the scheduler holds {self._total} connections that proved nothing yet"
            room = self._make_room(self._unproven)
        if not room:
            _cut(fd, peer)
            self._warn(source, f"cut a connection from {source}: {why}")
            return
        known = _Unproven(peer, time.monotonic())
        self._unproven[fd] = known
        self._by_source.setdefault(source, {})[fd] = known

    def _make_room(self, oldest_first: dict[int, _Unproven]) -> bool:
        """Cuts the oldest of these connections if it has had its time."""
        fd, known = next(iter(oldest_first.items()))
        if time.monotonic() - known.since <= STALE_S:
            return False
        self.vouch(fd)  # Counts no more: it is going.
        _cut(fd, known.peer)
        self._warn(known.peer[0], f"cut a connection from {known.peer[0]}: it proved nothing "
                   f"in {STALE_S:g} s and a newcomer needs its place")
        return True

    def _warn(self, source: str, text: str) -> None:
        held = self._warnings.allow(f"cut {source}")
        if held is not None:
            log.warning("%s%s", text, f" (and {held} more held back)" if held else "")

    def close(self) -> None:
        self._monitor.close(linger=0)


def _peer(fd: int) -> tuple | None:
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            return tuple(sock.getpeername())
    except OSError:
        return None


def _cut(fd: int, peer: tuple) -> None:
    """Shuts down the connection on `fd` if it is still the one to `peer`."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            if tuple(sock.getpeername()) == peer:
                sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
