"""The scheduler: rendezvous, membership and lifetime of a job. It never sees tensor
data.

Start it with `DMLC_ROLE=scheduler bpslaunch` or `python -m tf_bps.control.scheduler`.

Membership comes in generations. The first is the job as it starts: DMLC_NUM_WORKER
workers and DMLC_NUM_SERVER servers. In an elastic job (BYTEPS_ELASTIC=1) a lost
worker, or one that asks to join, starts the next (membership_changes.py): every
surviving node registers again and gets a new address book (survivors keep their order,
newcomers come after them); frames carry the generation, so nothing of an older one
reaches the rounds of a newer one. Without BYTEPS_ELASTIC, any loss ends the job.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
import time

import zmq

from tf_bps.control.inbox import Inbox, quoted
from tf_bps.control.membership import Gathering, Node, address_books
from tf_bps.control.membership_changes import JobFailed, MembershipChanges
from tf_bps.control.scheduler_metrics import Membership, SchedulerCollector
from tf_bps.runtime import metrics
from tf_bps.runtime.config import Config, ConfigError, configure_logging

log = logging.getLogger("tf_bps.scheduler")

# What a node may advertise as its host: a name or an address, nothing to escape.
HOST = re.compile(r"[A-Za-z0-9_.:%\[\]-]{1,255}")
# While a job forms, who is still missing is said this often (after the first wait).
WAITING_REPORT_S = 5.0


class Scheduler:
    def __init__(self, config: Config):
        self._config = config
        self._nodes: dict[bytes, Node] = {}  # this generation's, by connection
        self._generation = 0
        self._gathering: Gathering | None = None  # while a generation registers
        # The one socket; connections of no node are read at a bounded rate (inbox.py).
        self._inbox = Inbox(config, is_member=lambda identity: (
            identity in self._nodes or self._changes.is_launcher(identity)))
        self._changes = MembershipChanges(config, self._inbox)
        self._membership = Membership()  # what the metrics endpoint reads, replaced whole

    def run(self) -> int:
        if not self._config.job_token:
            log.warning("BYTEPS_JOB_TOKEN is not set: any process that reaches this job's "
                        "ports can join it (bpslaunch -np sets one; set the same on every "
                        "node of a job started role by role)")
        try:
            metrics.serve(self._config, SchedulerCollector(
                lambda: self._membership, lambda: self._inbox.turned_away), "scheduler")
            self._rendezvous(Gathering(0, time.monotonic() + self._config.start_timeout, {}))
            self._supervise()
            return 0
        except JobFailed as error:
            log.error("%s", error)
            for node in self._everyone():
                self._inbox.send(node.identity, {"type": "abort", "reason": str(error)})
            if self._config.elastic:
                self._changes.turn_away(str(error))
            return 1
        finally:
            self._inbox.close()

    def _everyone(self) -> list[Node]:
        """Every node that may still listen: this generation's, those asking to join,
        and while a generation registers, those registered and those still expected."""
        nodes = [*self._nodes.values(), *self._changes.joining]
        if self._gathering is not None:
            gathering = self._gathering
            nodes += [*gathering.servers, *gathering.workers, *gathering.survivors.values()]
        return nodes

    def _registered(self, identity: bytes) -> bool:
        """Whether the connection `identity` registered for the coming generation."""
        gathering = self._gathering
        registering = gathering.servers + gathering.workers if gathering else []
        waiting = [*self._changes.joining, *registering]
        return any(node.identity == identity for node in waiting)

    # -- registration ---------------------------------------------------------------

    def _expected_workers(self, workers: list[Node]) -> int:
        # Registration keeps BYTEPS_LOCAL_SIZE the same on every worker.
        return self._config.num_worker * (workers[0].local_size if workers else 1)

    def _registration(self, identity: bytes, message: dict,
                      gathering: Gathering | None) -> tuple[Node | None, str]:
        """The node a registration that proved the token (inbox.py) describes, or why it
        is refused: a malformed message; in the first generation a server beyond
        DMLC_NUM_SERVER, a worker rank outside the job or taken. Later generations
        (`gathering` not the first, or None between two) number their nodes when their
        books go out."""
        config = self._config

        def number(key: str, low: int, high: int) -> int | None:
            value = message.get(key)
            ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
            return value if ok else None

        role, host = message.get("role"), message.get("host")
        pid = number("pid", 1, 2**31)
        port = number("port", 1, 65535) if role == "server" else 0  # Workers listen on none.
        if role not in ("server", "worker", "launcher") or not isinstance(host, str) or \
                not HOST.fullmatch(host) or pid is None or port is None:
            return None, f"a malformed registration: {quoted(message)}"
        node = Node(identity, role, host, pid, port=port, last_seen=time.monotonic())
        local_size = number("local_size", 1, 4096)
        local_rank = number("local_rank", 0, (local_size or 1) - 1)
        if role == "worker" and (local_size is None or local_rank is None):
            return None, f"a malformed worker registration from {host} (pid {pid})"
        node.local_size = local_size or 1
        lost, name = message.get("lost_server"), message.get("name")
        node.saw_lost = lost[:300] if isinstance(lost, str) else ""
        node.name = name[:300] if isinstance(name, str) else ""
        node.moves_lost_servers = message.get("moves_lost_servers") is True
        if self._changes.let_go_registers_again(node.process):
            return None, (f"the worker on {host} (pid {pid}) was let go: its host left the "
                          "job (the discovery script no longer lists it)")
        if role == "launcher":
            return node, ""
        node.merge_mode = message.get("local_merge") if message.get("local_merge") in (
            "auto", "1") else "0"
        if gathering is None or not gathering.first:
            return node, ""  # An elastic job's: workers and servers may join.
        servers, workers = gathering.servers, gathering.workers
        if role == "server":
            if len(servers) >= config.num_server:
                return None, (f"a server from {host} (pid {pid}) is one too many: the job has "
                              f"DMLC_NUM_SERVER={config.num_server}")
            node.rank = len(servers)
            return node, ""
        worker_id = number("worker_id", 0, config.num_worker - 1)
        if workers and local_size != workers[0].local_size:
            return None, (f"the worker on {host} (pid {pid}) has BYTEPS_LOCAL_SIZE={local_size}"
                          f", the others {workers[0].local_size}")
        if worker_id is None:
            return None, (f"DMLC_WORKER_ID={quoted(message.get('worker_id'), 32)} of the "
                          f"worker on {host} (pid {pid}) is outside this job of DMLC_NUM_WORKER="
                          f"{config.num_worker}")
        node.rank = worker_id * local_size + local_rank
        clash = [w for w in workers if w.rank == node.rank]
        if clash and config.elastic:
            node.rank = -1  # Workers of an elastic job are alike: it joins the next one.
            return node, ""
        if clash:
            return None, (f"rank {node.rank} is already taken by pid {clash[0].pid} on "
                          f"{clash[0].host}; check DMLC_WORKER_ID and BYTEPS_LOCAL_RANK")
        return node, ""

    def _accept(self, identity: bytes, message: dict,
                gathering: Gathering | None) -> Node | None:
        """The node a registration makes, or None: refused (it hears why), or an
        elastic launcher's connection, which is answered and kept apart."""
        node, refusal = self._registration(identity, message, gathering)
        if refusal:
            self._inbox.refuse(identity, refusal)
            return None
        if node.role == "launcher":
            self._changes.launcher_connected(identity)
            self._inbox.send(identity, {"type": "book"})
            return None
        self._changes.registered(node)
        return node

    def _rendezvous(self, gathering: Gathering) -> None:
        """Gathers one generation's registrations and sends its address books."""
        config = self._config
        self._gathering = gathering
        self._membership = dataclasses.replace(self._membership, forming=True)
        changes = self._changes
        for node in changes.take_joiners():
            self._admit(gathering, node)
        report_at = time.monotonic() + WAITING_REPORT_S
        while not self._complete(gathering):
            changes.drop_silent_survivors(gathering)
            if time.monotonic() >= report_at:
                self._report_waiting(gathering)
                report_at = time.monotonic() + WAITING_REPORT_S
            remaining = gathering.deadline - time.monotonic()
            if remaining <= 0:
                if changes.can_form_without_the_missing(gathering):
                    break
                raise JobFailed(self._unfinished(gathering))
            received = self._inbox.receive(min(remaining, config.heartbeat_interval,
                                         max(0.0, report_at - time.monotonic())))
            if received is None:
                continue
            identity, message = received
            if changes.is_launcher(identity):
                changes.from_launcher(message, self._nodes)
                continue
            if message["type"] != "register":
                changes.hear_from_survivor(identity, message, gathering)
                continue
            if self._registered(identity):
                continue  # Said twice; a challenge is good for a minute, not for once.
            node = self._accept(identity, message, gathering)
            if node is None:
                continue
            if node.rank < 0 and gathering.first:
                changes.defer(node)
                continue
            self._admit(gathering, node)
            log.info("registered %s", node.describe() if gathering.first else
                     f"{node.role} pid {node.pid} on {node.host} for generation "
                     f"{gathering.number}")
        self._form(gathering)
        self._gathering = None
        changes.formed(self._nodes)
        if config.elastic and len(gathering.workers) < config.elastic_min_workers:
            raise JobFailed(self._unfinished(gathering))

    def _report_waiting(self, gathering: Gathering) -> None:
        """Says who the job still waits for, here and to every node already in, so
        that a start that takes long is never silent (bps.init() logs it)."""
        config = self._config
        left = f"{gathering.deadline - time.monotonic():.0f} s left"
        if gathering.first:
            expected = self._expected_workers(gathering.workers)
            absent = sorted(set(range(expected)) - {n.rank for n in gathering.workers})
            text = (f"the job waits for worker rank(s) {absent} and "
                    f"{config.num_server - len(gathering.servers)} more server(s) "
                    f"({len(gathering.workers)} of {expected} worker(s) and "
                    f"{len(gathering.servers)} of {config.num_server} server(s) registered; "
                    f"{left} of {config.start_timeout_variable})")
        else:
            missing = ", ".join(node.describe() for node in gathering.missing()) or "none"
            text = (f"generation {gathering.number} waits for {missing} to register again "
                    f"({left} of BYTEPS_ELASTIC_TIMEOUT)")
        log.warning("%s", text)
        for node in gathering.servers + gathering.workers:
            self._inbox.send(node.identity, {"type": "waiting", "reason": text})

    @staticmethod
    def _admit(gathering: Gathering, node: Node) -> None:
        if node.process in gathering.survivors:
            node.previous_rank = gathering.survivors[node.process].rank
            # A survivor saw a server go away without a word: no use waiting for it.
            for key, other in list(gathering.survivors.items()):
                if other.role == "server" and f"{other.host}:{other.port}" == node.saw_lost:
                    log.warning("%s is lost as well, says %s", other.describe(),
                                gathering.survivors[node.process].describe())
                    del gathering.survivors[key]
        (gathering.servers if node.role == "server" else gathering.workers).append(node)

    def _complete(self, gathering: Gathering) -> bool:
        config = self._config
        if gathering.first:
            return (len(gathering.servers) >= config.num_server and
                    len(gathering.workers) >= self._expected_workers(gathering.workers))
        return not gathering.missing() and bool(gathering.servers) and \
            len(gathering.workers) >= config.elastic_min_workers

    def _unfinished(self, gathering: Gathering) -> str:
        config = self._config
        workers, servers = gathering.workers, gathering.servers
        if gathering.first:
            ranks = sorted(node.rank for node in workers)
            return (f"only {len(workers)} worker(s) (ranks {ranks}) and {len(servers)} of "
                    f"{config.num_server} server(s) registered within {config.start_timeout:g} "
                    f"s ({config.start_timeout_variable}); check DMLC_NUM_WORKER, "
                    "DMLC_NUM_SERVER and that every node reaches the scheduler")
        missing = ", ".join(node.describe() for node in gathering.missing()) or "none"
        return (f"the job could not re-form ({gathering.reason}): {len(workers)} worker(s) "
                f"and {len(servers)} server(s) registered within BYTEPS_ELASTIC_TIMEOUT="
                f"{config.elastic_timeout:g} s, and it needs a server and at least "
                f"BYTEPS_ELASTIC_MIN_WORKERS={config.elastic_min_workers} worker(s); of the "
                f"last generation, missing: {missing}")

    def _form(self, gathering: Gathering) -> None:
        """Numbers the generation's nodes and sends their address books."""
        books = address_books(gathering)
        self._generation = gathering.number
        self._nodes = {node.identity: node for node in gathering.servers + gathering.workers}
        self._inbox.keep_seals_of({*self._nodes, *self._changes.connections()})
        now = time.monotonic()
        for node in self._nodes.values():
            node.last_seen = now
        for identity, book in books:
            self._inbox.send(identity, book)
        size, servers = len(gathering.workers), len(gathering.servers)
        self._membership = Membership(
            workers=size, servers=servers, generation=gathering.number, forming=False,
            reforms=self._membership.reforms + (0 if gathering.first else 1))
        if gathering.first:
            log.info("job started: %d worker(s), %d server(s)", size, servers)
        else:
            log.warning("job re-formed as generation %d: %d worker(s), %d server(s)",
                        gathering.number, size, servers)

    # -- membership changes (BYTEPS_ELASTIC, membership_changes.py) -----------------

    def _lose(self, lost: list[Node], reason: str) -> None:
        """Workers or servers are gone: the job fails, goes on without lost servers, or
        re-forms."""
        self._next(self._changes.lose(self._nodes, self._generation, lost, reason))

    def _next(self, gathering: Gathering | None) -> None:
        """Forms the next generation where a change asks for one."""
        if gathering is not None:
            self._nodes = {}
            self._rendezvous(gathering)

    def _server_lost_by(self, worker: Node, address: object) -> None:
        """A worker's connection to a server broke without a word from it: the server
        is taken as lost (a server of another generation, or one already gone, is
        not this generation's to lose)."""
        lost = [n for n in self._nodes.values()
                if n.role == "server" and f"{n.host}:{n.port}" == address]
        if lost:
            self._lose(lost, f"{worker.describe()} lost its connection to "
                       f"{lost[0].describe()}")

    def _from_outsider(self, identity: bytes, message: dict) -> None:
        """A message from a connection of no node of this generation: a registration
        that proved the token, say. A job that is not elastic takes no one after it
        started; an elastic one re-forms at once when a survivor of this generation
        registers again (it left it), and at the workers' next commit for a newcomer."""
        kind = message["type"]
        changes = self._changes
        if changes.is_launcher(identity):
            changes.from_launcher(message, self._nodes)
            return
        if changes.turned_away(identity, kind):
            return
        if kind != "register" or self._registered(identity):
            return  # Heartbeats and farewells of nodes of an earlier generation.
        if not self._config.elastic:
            self._inbox.refuse(identity, "the job has already started: every node of it has "
                               "registered")
            return
        node = self._accept(identity, message, None)
        if node is not None:
            self._next(changes.join(node, self._nodes, self._generation))

    # -- supervision ----------------------------------------------------------------

    def _supervise(self) -> None:
        config = self._config
        while True:
            workers = [n for n in self._nodes.values() if n.role == "worker"]
            if all(n.done for n in workers):
                for node in self._nodes.values():
                    if node.role == "server":
                        self._inbox.send(node.identity, {"type": "exit"})
                log.info("all workers finished; job complete")
                return
            # Joiners, once the launcher's others are in, or late.
            self._changes.announce_joiners(self._nodes)
            # Workers that stopped at a commit, once all did (or some are late).
            self._next(self._changes.reform_once_all_left(self._nodes, self._generation))
            received = self._inbox.receive(config.heartbeat_interval)
            now = time.monotonic()
            if received is not None:
                identity, message = received
                node = self._nodes.get(identity)
                if node is None:
                    self._from_outsider(identity, message)
                    continue
                node.last_seen = now
                kind = message.get("type")
                if kind == "heartbeat":
                    self._inbox.send(node.identity, {"type": "heartbeat_ack"})
                elif kind == "done":
                    node.done = True
                    log.info("%s finished", node.describe())
                elif kind == "failure":
                    self._lose(self._lost_by(node, message),
                               f"{node.describe()} reported: {quoted(message.get('reason'))}")
                    continue
                elif kind == "server_lost" and node.role == "worker":
                    self._server_lost_by(node, message.get("server"))
                    continue
                elif kind == "preempted" and node.role == "worker" and config.elastic:
                    # A preemption notice (SIGTERM): the worker finishes its step and
                    # leaves at the next commit, as if its host had left the job.
                    self._changes.let_go([node], self._nodes, "it was told to stop "
                                         f"({quoted(message.get('signal'))})")
                    continue
            for node in list(self._nodes.values()):
                silent = now - node.last_seen
                if not node.done and not self._changes.has_left(node) and \
                        silent > config.heartbeat_timeout:
                    self._lose([node], f"{node.describe()} sent no heartbeat for {silent:.0f} "
                               "s (PS_HEARTBEAT_TIMEOUT); it has probably died")
                    break

    def _lost_by(self, reporter: Node, message: dict) -> list[Node]:
        """Whom a failure report costs the job: the worker a server names as lost, or
        the reporting node itself."""
        if reporter.role == "server":
            lost = message.get("lost_rank")
            named = [n for n in self._nodes.values() if n.role == "worker" and n.rank == lost]
            return named or [reporter]  # A server's own failure, then.
        return [reporter]


def main() -> int:
    try:
        config = Config.from_env()
        configure_logging(config, "tf_bps scheduler")
        return Scheduler(config).run()
    except (ConfigError, zmq.ZMQError) as error:
        print(f"tf_bps scheduler: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
