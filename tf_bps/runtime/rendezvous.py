"""The control plane between nodes and the scheduler (pyzmq, JSON messages).

Messages, node -> scheduler: hello, register, heartbeat, done (a worker finished
cleanly), failure (a node saw a peer die). Scheduler -> node: challenge, book (the
address book and this node's rank), heartbeat_ack, abort (the job is failing: stop),
exit (the job is over); in an elastic job also reform (this generation ends: register
again) and hosts_updated (a worker asks to join: re-form at the next commit). No
tensor data ever travels here.

Registration proves the job token both ways (BYTEPS_JOB_TOKEN, a keyed hash over fresh
nonces of both sides, never the token itself), the node first: it says hello, the
scheduler answers with a challenge (a nonce of its own, no proof: it proves nothing to
a stranger), the registration carries the node's nonce and its proof over both, and
only then does the scheduler prove itself ("registered", over the same two nonces),
which the node checks before it believes anything else the scheduler says. A node that
cannot prove the token hears only "refused"; a scheduler that cannot prove it is not
trusted. With BYTEPS_ENCRYPT, the registration's fields and everything after it are
sealed with keys of that registration (sealing.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable

import zmq

from tf_bps.runtime.config import Config
from tf_bps.runtime.sealing import ControlSeal

log = logging.getLogger("tf_bps")
# A node waiting for the scheduler says so when it has heard nothing for this long (a
# scheduler that is up says who the job waits for more often: WAITING_REPORT_S).
QUIET_S = 8.0
# A node that has had no challenge says hello again this often.
HELLO_AGAIN_S = 3.0


class RendezvousError(RuntimeError):
    """The scheduler could not be reached, refused this node, or the job failed."""


# All a node that has not proven the token hears when the scheduler refuses it.
REFUSED = "refused"


def new_nonce() -> str:
    return secrets.token_hex(16)


def proof(token: str, side: str, nonce: str) -> str:
    """What `side` ("node" or "scheduler") shows for `nonce` (the registration's two
    nonces, "challenge|node nonce", and what a refusal says)."""
    return hmac.new(token.encode(), f"{side}|{nonce}".encode(), hashlib.sha256).hexdigest()


def proof_matches(token: str, side: str, nonce: str, shown: object) -> bool:
    return isinstance(shown, str) and hmac.compare_digest(proof(token, side, nonce), shown)


def scheduler_endpoint(config: Config) -> str:
    uri, port = config.require_rendezvous()
    return f"tcp://{uri}:{port}"


class SchedulerLink:
    """A node's connection to the scheduler: registration, then heartbeats."""

    def __init__(self, config: Config):
        self._config = config
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 2000)
        self._socket.connect(scheduler_endpoint(config))
        self._last_ack = time.monotonic()
        self._next_heartbeat = 0.0
        self._endpoint = scheduler_endpoint(config)
        self._thread: threading.Thread | None = None
        self._wake_send: zmq.Socket | None = None
        # BYTEPS_ENCRYPT: seals every message after the registration (sealing.py).
        self._seal: ControlSeal | None = None
        self._seal_lock = threading.Lock()  # the monitor and the caller both send
        # While registering: "challenge", "registered" or "book", what it waits for
        # (what may come in the clear, and whether an abort is believed).
        self._stage: str | None = None
        self._said = ""  # the registration's nonces, "challenge|node nonce"

    def register(self, role: str, **fields) -> dict:
        """Proves the job token, registers this node and waits for the address book."""
        host = self._config.advertised_host()  # Settings fail here, before any wait.
        deadline = time.monotonic() + self._config.start_timeout
        token, mine = self._config.job_token, new_nonce()
        def hello():
            with self._seal_lock:  # In the clear: the scheduler has no keys for it yet.
                self._stage = "challenge"
                self._socket.send_json({"type": "hello"})

        hello()
        try:
            # The challenge goes back with the proof: the scheduler keeps none (challenges.py).
            # Said again now and then: a scheduler full of strangers' connections may cut
            # ours (ZeroMQ connects again) before it read the hello.
            reply = self._next_reply(deadline, "challenge", again=hello)
            challenge = str(reply.get("nonce"))[:128]
            said = f"{challenge}|{mine}"
            message = {"type": "register", "role": role, "pid": os.getpid(), "host": host,
                       **fields}
            shown = {"nonce": challenge, "node_nonce": mine, "proof": proof(token, "node", said)}
            with self._seal_lock:
                if self._config.encrypt:
                    # Fields sealed as message 1 under this registration's own keys; the
                    # scheduler derives them from the clear nonces once the proof checks.
                    self._seal = ControlSeal(token, challenge, mine, "node")
                    sealed = self._seal.seal(message)
                    message = {"type": "register", "seq": sealed["seq"], "box": sealed["box"]}
                self._said = said
                self._stage = "registered"
                self._socket.send_json({**message, **shown})
            registered = self._next_reply(deadline, "registered")
            if not proof_matches(token, "scheduler", said, registered.get("proof")):
                raise RendezvousError(
                    f"the scheduler at {self._endpoint} does not know this job's token "
                    "(BYTEPS_JOB_TOKEN): it is not this job's scheduler")
            self._stage = "book"
            book = self._next_reply(deadline, "book")
        finally:
            self._stage = None
        self._last_ack = time.monotonic()
        return book

    def _refusal(self, abort: dict) -> RendezvousError:
        """What an abort that answers this node's registration means for it."""
        reason = str(abort.get("reason"))
        if self._stage == "book" or proof_matches(
                self._config.job_token, "scheduler", f"{self._said}|{reason}",
                abort.get("proof")):
            return RendezvousError(f"the scheduler refused this node: {reason}")
        return RendezvousError(
            f"the scheduler at {self._endpoint} refused this node before it proved the "
            "job's token: check that BYTEPS_JOB_TOKEN and BYTEPS_ENCRYPT are the job's "
            "(the scheduler's log says why)")

    def _next_reply(self, deadline: float, kind: str, again: Callable[[], None] | None = None
                    ) -> dict:
        """The scheduler's next message of `kind`; an abort or the deadline raises.
        `again`, if given, runs whenever HELLO_AGAIN_S pass without one."""
        heard_at = time.monotonic()
        while True:
            remaining = deadline - time.monotonic()
            wait = min(remaining, HELLO_AGAIN_S if again else QUIET_S)
            if remaining > 0 and not self._socket.poll(int(wait * 1000)):
                if again is not None:
                    again()
                quiet = time.monotonic() - heard_at
                if quiet >= QUIET_S and remaining > wait:  # Never silent for long.
                    log.warning("no %s from the scheduler at %s yet (%.0f s left of %s)",
                                kind, self._endpoint, remaining - wait,
                                self._config.start_timeout_variable)
                    heard_at = time.monotonic()
                continue
            if remaining <= 0:
                what = "address book" if kind == "book" else "answer"
                raise RendezvousError(
                    f"no {what} from the scheduler at {self._endpoint} within "
                    f"{self._config.start_timeout:g} s (is it running, and have all "
                    f"{self._config.num_worker} worker(s) and {self._config.num_server} "
                    f"server(s) started? see {self._config.start_timeout_variable})")
            reply = self._decode(self._socket.recv())
            if reply is None:
                continue
            if reply["type"] == kind:
                return reply
            if reply["type"] == "abort" and self._stage in ("registered", "book"):
                raise self._refusal(reply)
            if reply["type"] == "waiting" and self._stage == "book":
                log.warning("%s", reply.get("reason"))

    def poll_once(self, extra: list | None = None) -> tuple[list, list]:
        """Sends a heartbeat when one is due, then waits until the next is due for
        scheduler messages or for `extra` sockets and descriptors to turn readable.

        Returns (scheduler messages, ready extra items). Raises RendezvousError when
        the scheduler has been silent for longer than PS_HEARTBEAT_TIMEOUT.
        """
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self.send({"type": "heartbeat"})
            self._next_heartbeat = now + self._config.heartbeat_interval
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        for item in extra or []:
            poller.register(item, zmq.POLLIN)
        wait_ms = max(0, int((self._next_heartbeat - time.monotonic()) * 1000))
        ready = dict(poller.poll(wait_ms))
        messages = []
        while self._socket.poll(0):
            message = self._decode(self._socket.recv())
            if message is None:
                continue
            self._last_ack = time.monotonic()
            if message["type"] != "heartbeat_ack":
                messages.append(message)
        silent = time.monotonic() - self._last_ack
        if silent > self._config.heartbeat_timeout:
            raise RendezvousError(
                f"the scheduler at {self._endpoint} has not answered for {silent:.0f} s "
                "(PS_HEARTBEAT_TIMEOUT); it has probably died")
        return messages, [item for item in extra or [] if item in ready]

    def send(self, message: dict) -> None:
        with self._seal_lock:
            if self._seal is not None:
                message = self._seal.seal(message)
            self._socket.send_json(message)

    def _decode(self, raw: bytes) -> dict | None:
        """A message from the scheduler, or None for one to drop: not a JSON object with
        a "type", or, with BYTEPS_ENCRYPT, one that does not open under this
        registration's keys (in the clear come only the challenge and a refusal of the
        registration, which _refusal() believes only with the scheduler's proof)."""
        try:
            message = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str) or \
                not message["type"]:
            return None
        kind, stage = message["type"], self._stage
        if not self._config.encrypt or (kind, stage) in (("challenge", "challenge"),
                                                        ("abort", "registered")):
            return message
        opened = self._seal.open(message) if self._seal is not None else None
        if opened is None and stage is None:  # Registering, old keys' messages are due.
            log.warning("dropped a control message from %s that does not authenticate "
                        "(BYTEPS_ENCRYPT)", self._endpoint)
        return opened

    def start_monitor(self, on_abort: Callable[[str], None],
                      on_notice: Callable[[dict], None],
                      watch: tuple[int, Callable[[], list]] | None = None) -> None:
        """Heartbeats from a background thread; `on_abort` runs if the job fails, and
        `on_notice` with an elastic job's reform, hosts_updated and server_gone
        messages. `watch`: (a descriptor, reports): whenever the descriptor turns
        readable it is drained, and the messages reports() returns go to the scheduler
        (the core's lost servers)."""
        wake_recv = self._context.socket(zmq.PAIR)
        wake_recv.bind(f"inproc://wake-{id(self)}")
        self._wake_send = self._context.socket(zmq.PAIR)
        self._wake_send.connect(f"inproc://wake-{id(self)}")
        self._thread = threading.Thread(target=self._monitor,
                                        args=(wake_recv, on_abort, on_notice, watch),
                                        name="tf_bps-heartbeat", daemon=True)
        self._thread.start()

    def _monitor(self, wake: zmq.Socket, on_abort: Callable[[str], None],
                 on_notice: Callable[[dict], None],
                 watch: tuple[int, Callable[[], list]] | None) -> None:
        watched = [watch[0]] if watch else []
        try:
            while True:
                messages, ready = self.poll_once([wake, *watched])
                for message in messages:
                    if message["type"] == "abort":
                        on_abort(str(message.get("reason")))
                        return
                    if message["type"] in ("reform", "hosts_updated", "server_gone"):
                        # After a reform, heartbeats go on until this node registers
                        # again: the scheduler waits for it as long as it lives.
                        on_notice(message)
                if watch and watch[0] in ready:
                    os.read(watch[0], 4096)
                    for report in watch[1]():
                        self.send(report)
                if wake in ready:
                    word = wake.recv_json()
                    if isinstance(word, dict) and "forward" in word:  # from tell()
                        self.send(word["forward"])
                        continue
                    if word is not None:
                        self.send(word)  # the farewell
                    return
        except RendezvousError as error:
            on_abort(str(error))
        finally:
            wake.close(linger=0)

    def tell(self, message: dict) -> None:
        """Sends `message` to the scheduler from the thread that started the monitor: the
        monitor's thread owns the socket then, and passes it on."""
        if self._thread is None or not self._thread.is_alive():
            raise RendezvousError(f"no connection to the scheduler at {self._endpoint} to "
                                  f"send {message.get('type')!r} on")
        self._wake_send.send_json({"forward": message})

    def close(self, failure: str | None = None, say_done: bool = True) -> None:
        """Says goodbye: the failure that ended this node, else done (if `say_done`)."""
        farewell = {"type": "failure", "reason": failure} if failure else {"type": "done"}
        if failure is None and not say_done:
            farewell = None
        if self._thread is not None:
            if self._thread.is_alive():
                self._wake_send.send_json(farewell)
            self._thread.join(timeout=5)
            self._wake_send.close(linger=0)
            if self._thread.is_alive():
                # Its socket stays open, and terminating the context would wait for it
                # forever: the process's exit takes them both.
                log.warning("the heartbeat thread to %s did not end within 5 s; leaving "
                            "without waiting for it", self._endpoint)
                return
        elif farewell is not None:
            self.send(farewell)
        self._socket.close()
        self._context.term()
