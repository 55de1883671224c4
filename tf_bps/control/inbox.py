"""The scheduler's one socket: a ZeroMQ ROUTER that every node reaches, and anyone else
who finds the port. It checks what arrives before the scheduler sees it (raw bytes,
extra frames, not JSON, not an object with a string "type": logged and dropped), answers
hellos with challenges, checks registrations (challenges.py: the node proves the token
first, then the scheduler proves it back), opens and seals messages (BYTEPS_ENCRYPT,
sealing.py), and reads connections of no member of the job at a bounded rate, in all and
per connection (throttle.py), among a bounded number of connections (doorman.py), so that
no stranger can starve the job.

A connection that has not proven the token learns nothing but a challenge and, when it
registers without a proof, "refused": the scheduler's log keeps the details, escaped and
at a bounded rate per source address.
"""

from __future__ import annotations

import collections
import logging
import re
import socket
import time
from collections.abc import Callable

import zmq

from tf_bps.control.challenges import Challenges
from tf_bps.control.doorman import Doorman
from tf_bps.control.throttle import (
    OUTSIDER_MESSAGES_PER_S,
    ConnectionBudgets,
    OutsiderThrottle,
    SourceWarnings,
)
from tf_bps.runtime.config import Config, is_local_address
from tf_bps.runtime.rendezvous import REFUSED, proof, proof_matches
from tf_bps.runtime.sealing import SchedulerSeals

log = logging.getLogger("tf_bps.scheduler")

# A node's messages are small JSON objects; anything larger is not one of ours, and
# ZeroMQ drops the connection that sends it before allocating it.
MAX_MESSAGE_BYTES = 64 * 1024
# A node has a few messages in flight at most; a flood of strangers' connections then
# holds this many each, not ZeroMQ's default of 1000: with the doorman's bound on
# connections, at most 1024 x 4 x 64 KiB (256 MiB) however the strangers try, and a few
# MiB for the hellos they can send.
MESSAGES_QUEUED_PER_PEER = 16
MESSAGES_RECEIVED_PER_PEER = 4
ZMQ_ZERO_COPY_RECV = 96  # zmq.h's number; pyzmq names no constant for it
# A node's nonce: what rendezvous.new_nonce() makes, give or take its length.
NODE_NONCE = re.compile(r"[0-9a-f]{16,64}")


def quoted(text: object, limit: int = 200) -> str:
    """A peer's text as the scheduler's log shows it: escaped (no line breaks or terminal
    controls of its choosing) and cut to `limit` characters."""
    text = str(text)
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


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
        self._socket.setsockopt(zmq.RCVHWM, MESSAGES_RECEIVED_PER_PEER)
        # And each of those messages its own few bytes: received in place (ZeroMQ's
        # default), every queued message would pin the 8 KB read buffer it came in.
        self._socket.setsockopt(ZMQ_ZERO_COPY_RECV, 0)
        # Only the address the job knows the scheduler by, when it is this machine's.
        address = socket.gethostbyname(root_uri)
        local = is_local_address(address) and not config.listen_any
        self._doorman = Doorman(self._socket)  # before the bind: it sees every accept
        self._socket.bind(f"tcp://{address if local else '*'}:{port}")
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._poller.register(self._doorman.monitor, zmq.POLLIN)
        self._outsiders = OutsiderThrottle()
        self._budgets = ConnectionBudgets()
        self._warnings = SourceWarnings()
        self._token = config.job_token
        self._challenges = Challenges()  # stateless: a flood of hellos evicts nothing
        # The connections that proved the token, with their seals (BYTEPS_ENCRYPT).
        self._seals = SchedulerSeals(config.job_token, config.encrypt)
        self._encrypt = config.encrypt
        # Messages turned away, by why (malformed, refused, replayed, unopened, flood):
        # the scheduler's metrics.
        self.turned_away: collections.Counter[str] = collections.Counter()

    def send(self, identity: bytes, message: dict) -> None:
        message = self._seals.seal(identity, message)
        self._socket.send_multipart([identity, zmq.utils.jsonapi.dumps(message)])

    def _send_clear(self, identity: bytes, message: dict) -> None:
        self._socket.send_multipart([identity, zmq.utils.jsonapi.dumps(message)])

    def refuse(self, identity: bytes, refusal: str) -> None:
        """Refuses a registration that proved the token (the node hears why): its
        connection is not the job's."""
        log.warning("refused a registration: %s", refusal)
        self.turned_away["refused"] += 1
        self.send(identity, {"type": "abort", "reason": refusal})
        self._seals.forget(identity)

    def proven(self, identity: bytes) -> bool:
        """Whether the connection `identity` proved the job's token in a registration."""
        return self._seals.proven(identity)

    def keep_seals_of(self, identities: set[bytes]) -> None:
        """Forgets the seals of every other connection (a generation formed)."""
        self._seals.keep_only(identities)

    def _warn(self, source: str, what: str, text: str, *args) -> None:
        """A warning about what `source` sent, at a bounded rate per source and `what`
        (malformed, refused, ...: one kind of trouble does not hide another)."""
        self.turned_away[what] += 1
        held = self._warnings.allow(f"{what} {source}")
        if held is not None:
            log.warning(text + (" (and %d more from it held back)" if held else ""),
                        *args, *((held,) if held else ()))

    def receive(self, timeout_s: float) -> tuple[bytes, dict] | None:
        """The next well-formed message, as sent, or None once `timeout_s` passes:
        hellos are answered here, and registrations come only once they proved the
        token. Nothing that reaches the port may end the scheduler's loop."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._doorman.drain()
            try:  # Polling only when nothing is queued: a flood queues plenty.
                frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._poller.poll(int(remaining * 1000) + 1)
                continue
            parts = [frame.bytes for frame in frames]
            if not self._is_member(parts[0]):
                pause, news = self._outsiders.pay()
                if news:
                    log.warning("connections of no node of this job send more than %g "
                                "messages a second (a flood?): the scheduler reads them no "
                                "faster", OUTSIDER_MESSAGES_PER_S)
                self._keep_the_door(pause)
                if not self._budgets.allow(parts[0]):
                    self.turned_away["flood"] += 1
                    continue  # Past its connection's budget: dropped unread.
            received = self._take(parts, _source(frames[-1]))
            if received is not None and received[1]["type"] == "register":
                self._doorman.vouch(frames[-1].get(zmq.SRCFD))  # It proved the token.
            if received is not None:
                return received

    def _keep_the_door(self, seconds: float) -> None:
        """Pauses reading messages for `seconds`, cutting connections meanwhile: a flood
        of new ones must not outrun the doorman while the strangers' messages wait."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._doorman.monitor.poll(int(left * 1000) + 1):
                self._doorman.drain()

    def _take(self, parts: list[bytes], source: str) -> tuple[bytes, dict] | None:
        """What the scheduler should see of one received message, or None."""
        try:
            identity, payload = parts
            message = zmq.utils.jsonapi.loads(payload)
        except ValueError:  # Unpacking or decoding.
            message = None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            self._warn(source, "malformed", "dropped a malformed message from %s (%d part(s), "
                       "%d bytes)", source, len(parts), sum(len(p) for p in parts))
            return None
        kind = message["type"]
        if kind == "hello":  # In the clear, and no seal changes: a challenge, no proof.
            self._send_clear(identity, {"type": "challenge",
                                        "nonce": self._challenges.issue(identity)})
            return None
        if kind == "register":
            fields = self._registration(identity, message, source)
            return (identity, fields) if fields is not None else None
        opened = self._seals.open(identity, message)
        if opened is None:
            self._warn(source, "unopened", "dropped a control message from %s that %s", source,
                       "does not authenticate (BYTEPS_ENCRYPT)" if self._seals.proven(identity)
                       else "comes from a connection that has not registered")
            return None
        return identity, opened
    def _registration(self, identity: bytes, message: dict, source: str) -> dict | None:
        """A registration's fields once it proved the token with a fresh challenge of this
        connection, after the scheduler proved it back ("registered"); else None, and
        the node hears only "refused" (a registration that proved the token but does
        not fit, BYTEPS_ENCRYPT say, hears why, with the scheduler's proof)."""
        challenge, node_nonce = message.get("nonce"), message.get("node_nonce")
        why = self._challenges.check(identity, challenge)
        if not why and not (isinstance(node_nonce, str) and NODE_NONCE.fullmatch(node_nonce)):
            why = "carries no nonce of its own"
        if not why and not proof_matches(self._token, "node", f"{challenge}|{node_nonce}",
                                         message.get("proof")):
            why = "does not prove this job's token (BYTEPS_JOB_TOKEN)"
        if why:
            self._warn(source, "refused", "refused a registration from %s: it %s", source, why)
            self._send_clear(identity, {"type": "abort", "reason": REFUSED})
            return None
        why = self._challenges.answer(challenge)
        if why:  # No answer: a replay in a member's connection must not disturb it.
            self._warn(source, "replayed", "dropped a registration from %s: it %s", source, why)
            return None
        said = f"{challenge}|{node_nonce}"
        sealing = "box" in message
        if sealing != self._encrypt:
            reason = ("this node seals its control messages and the scheduler does not"
                      if sealing else "this node sends its control messages in the clear "
                      "and the scheduler seals them") + (
                " (BYTEPS_ENCRYPT): start every node of the job with the same setting")
            log.warning("refused a registration from %s: %s", source, reason)
            self.turned_away["refused"] += 1
            self._send_clear(identity, {"type": "abort", "reason": reason, "proof": proof(
                self._token, "scheduler", f"{said}|{reason}")})
            return None
        seal = self._seals.new_seal(challenge, node_nonce)
        fields = seal.open(message) if seal is not None else {
            key: value for key, value in message.items()
            if key not in ("nonce", "node_nonce", "proof")}
        if fields is None or fields["type"] != "register":
            self._warn(source, "refused", "refused a registration from %s: its fields do not "
                       "open with this job's token (BYTEPS_JOB_TOKEN)", source)
            self._send_clear(identity, {"type": "abort", "reason": REFUSED})
            return None
        self._seals.keep(identity, seal)
        self.send(identity, {"type": "registered",
                             "proof": proof(self._token, "scheduler", said)})
        return fields

    def close(self) -> None:
        self._doorman.close()
        self._socket.close()
        self._context.term()


def _source(frame: zmq.Frame) -> str:
    """The address a message came from, as ZeroMQ saw its connection."""
    try:
        return frame.get("Peer-Address")
    except (zmq.ZMQError, UnicodeDecodeError):
        return "an unknown address"
