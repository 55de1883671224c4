"""The scheduler: rendezvous, membership and lifetime of a job. It never sees tensor
data.

Start it with `DMLC_ROLE=scheduler bpslaunch` or `python -m tf_bps.control.scheduler`.

Membership comes in generations. The first is the job as it starts: DMLC_NUM_WORKER
workers and DMLC_NUM_SERVER servers. In an elastic job (BYTEPS_ELASTIC=1) a lost
worker, or one that asks to join, starts the next: every surviving node hears
"reform", registers again and gets a new address book (survivors keep their order,
newcomers come after them); frames carry the generation, so nothing of an older one
reaches the rounds of a newer one. Without BYTEPS_ELASTIC, any loss ends the job.
"""

from __future__ import annotations

import logging
import re
import sys
import time

import zmq

from tf_bps.control.inbox import Inbox, quoted
from tf_bps.control.membership import Gathering, Node, address_books
from tf_bps.runtime.config import Config, ConfigError, configure_logging

log = logging.getLogger("tf_bps.scheduler")

# Workers the elastic launcher starts together join at one commit: those registered
# wait for the others this long at most (one that fails to start is reported sooner).
LAUNCH_WAIT_S = 30.0
# What a node may advertise as its host: a name or an address, nothing to escape.
HOST = re.compile(r"[A-Za-z0-9_.:%\[\]-]{1,255}")
# While a job forms, who is still missing is said this often (after the first wait).
WAITING_REPORT_S = 5.0


class JobFailed(RuntimeError):
    """The job cannot go on; every node hears why."""


class Scheduler:
    def __init__(self, config: Config):
        self._config = config
        self._nodes: dict[bytes, Node] = {}  # this generation's, by connection
        self._generation = 0
        # Workers that asked to join an elastic job, waiting for the next generation.
        self._joining: list[Node] = []
        self._gathering: Gathering | None = None  # while a generation registers
        # An elastic launcher's connections (--host-discovery-script), and the workers
        # it let go (by process), which must not register again.
        self._launchers: set[bytes] = set()
        self._let_go: set[tuple[str, int]] = set()
        # Workers the launcher started together while the job runs (by name), not yet
        # registered: the workers re-form once all of them are in (or LAUNCH_WAIT_S
        # after the launch), so that a host's workers join at one commit.
        self._launching: set[str] = set()
        self._launched_at = 0.0
        self._announced = False  # the joiners were announced to this generation
        # Servers the job went on without (by connection): told to stop if they speak.
        self._dropped: set[bytes] = set()
        # The one socket; connections of no node are read at a bounded rate (inbox.py).
        self._inbox = Inbox(config, is_member=lambda identity: (
            identity in self._nodes or identity in self._launchers))

    def run(self) -> int:
        if not self._config.job_token:
            log.warning("BYTEPS_JOB_TOKEN is not set: any process that reaches this job's "
                        "ports can join it (bpslaunch -np sets one; set the same on every "
                        "node of a job started role by role)")
        try:
            self._rendezvous(Gathering(0, time.monotonic() + self._config.start_timeout, {}))
            self._supervise()
            return 0
        except JobFailed as error:
            log.error("%s", error)
            for node in self._everyone():
                self._inbox.send(node.identity, {"type": "abort", "reason": str(error)})
            if self._config.elastic:
                self._turn_away(str(error))
            return 1
        finally:
            self._inbox.close()

    def _turn_away(self, reason: str) -> None:
        """An elastic job's workers may be between two registrations when it fails:
        for a heartbeat timeout, every connection that proved the job's token and says
        anything hears why, instead of waiting for an address book that will never come
        (a stranger hears nothing of it)."""
        deadline = time.monotonic() + self._config.heartbeat_timeout
        while (remaining := deadline - time.monotonic()) > 0:
            received = self._inbox.receive(remaining)
            if received is not None and self._inbox.proven(received[0]):
                self._inbox.send(received[0], {"type": "abort", "reason": reason})

    def _everyone(self) -> list[Node]:
        """Every node that may still listen: this generation's, those asking to join,
        and while a generation registers, those registered and those still expected."""
        nodes = [*self._nodes.values(), *self._joining]
        if self._gathering is not None:
            gathering = self._gathering
            nodes += [*gathering.servers, *gathering.workers, *gathering.survivors.values()]
        return nodes

    def _registered(self, identity: bytes) -> bool:
        """Whether the connection `identity` registered for the coming generation."""
        gathering = self._gathering
        waiting = [*self._joining, *(gathering.servers + gathering.workers if gathering else [])]
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
        if node.process in self._let_go:
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
            self._launchers.add(identity)
            self._inbox.send(identity, {"type": "book"})
            return None
        self._launching.discard(node.name)
        return node

    def _rendezvous(self, gathering: Gathering) -> None:
        """Gathers one generation's registrations and sends its address books."""
        config = self._config
        self._gathering = gathering
        for node in self._joining:
            self._admit(gathering, node)
        self._joining = []
        report_at = time.monotonic() + WAITING_REPORT_S
        while not self._complete(gathering):
            self._drop_silent_survivors(gathering)
            if time.monotonic() >= report_at:
                self._report_waiting(gathering)
                report_at = time.monotonic() + WAITING_REPORT_S
            remaining = gathering.deadline - time.monotonic()
            if remaining <= 0:
                if self._can_form_without_the_missing(gathering):
                    break
                raise JobFailed(self._unfinished(gathering))
            received = self._inbox.receive(min(remaining, config.heartbeat_interval,
                                         max(0.0, report_at - time.monotonic())))
            if received is None:
                continue
            identity, message = received
            if identity in self._launchers:
                self._from_launcher(message)
                continue
            if message["type"] != "register":
                self._hear_from_the_last_generation(identity, message, gathering)
                continue
            if self._registered(identity):
                continue  # Said twice; a challenge is good for a minute, not for once.
            node = self._accept(identity, message, gathering)
            if node is None:
                continue
            if node.rank < 0 and gathering.first:
                self._joining.append(node)
                continue
            self._admit(gathering, node)
            log.info("registered %s", node.describe() if gathering.first else
                     f"{node.role} pid {node.pid} on {node.host} for generation "
                     f"{gathering.number}")
        self._form(gathering)
        self._gathering = None
        self._announced = False  # The new generation has heard of no joiner yet.
        if self._joining:
            self._announce_joiners()
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

    def _can_form_without_the_missing(self, gathering: Gathering) -> bool:
        """At a re-forming's deadline: survivors that did not register again are left
        behind, if a server and enough workers did."""
        if gathering.first or not gathering.servers:
            return False
        if len(gathering.workers) < self._config.elastic_min_workers:
            return False
        for node in gathering.missing():
            log.warning("%s did not register again within BYTEPS_ELASTIC_TIMEOUT; the job "
                        "goes on without it", node.describe())
        return True

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

    def _hear_from_the_last_generation(self, identity: bytes, message: dict,
                                       gathering: Gathering) -> None:
        """While the job re-forms, the survivors' links of the last generation still
        heartbeat until they register again; one that falls silent, says it failed, or
        that a server names as lost is no use waiting for."""
        node = next((n for n in gathering.survivors.values() if n.identity == identity), None)
        if node is None:
            return
        kind = message["type"]
        if kind == "heartbeat":
            node.last_seen = time.monotonic()
            self._inbox.send(identity, {"type": "heartbeat_ack"})
        elif kind == "failure" and node.role == "server":
            lost = message.get("lost_rank")
            for key, other in list(gathering.survivors.items()):
                if other.role == "worker" and other.rank == lost:
                    log.warning("%s is lost as well", other.describe())
                    del gathering.survivors[key]
        elif kind in ("failure", "done") and node.role == "worker":
            log.warning("%s left while the job re-formed: %s", node.describe(),
                        quoted(message.get("reason", "it finished")))
            del gathering.survivors[node.process]

    def _drop_silent_survivors(self, gathering: Gathering) -> None:
        now = time.monotonic()
        for node in gathering.missing():
            silent = now - node.last_seen
            if silent > self._config.heartbeat_timeout:
                why = (f"{node.describe()} sent no heartbeat for {silent:.0f} s while the job "
                       "re-formed; it has probably died")
                log.warning("%s", why)
                del gathering.survivors[node.process]
                servers = [n for n in gathering.survivors.values() if n.role == "server"]
                if node.role == "server" and not servers and not gathering.servers:
                    raise JobFailed(f"{why}; it was the job's last server")

    def _form(self, gathering: Gathering) -> None:
        """Numbers the generation's nodes and sends their address books."""
        books = address_books(gathering)
        self._generation = gathering.number
        self._nodes = {node.identity: node for node in gathering.servers + gathering.workers}
        self._inbox.keep_seals_of({*self._nodes, *self._launchers,
                               *(node.identity for node in self._joining)})
        now = time.monotonic()
        for node in self._nodes.values():
            node.last_seen = now
        for identity, book in books:
            self._inbox.send(identity, book)
        size, servers = len(gathering.workers), len(gathering.servers)
        if gathering.first:
            log.info("job started: %d worker(s), %d server(s)", size, servers)
        else:
            log.warning("job re-formed as generation %d: %d worker(s), %d server(s)",
                        gathering.number, size, servers)

    # -- membership changes (BYTEPS_ELASTIC) ------------------------------------------

    def _lose(self, lost: list[Node], reason: str) -> None:
        """Workers or servers are gone: the job fails, or an elastic one re-forms
        without them while it has a server left."""
        if not self._config.elastic:
            raise JobFailed(reason)
        servers = [n for n in self._nodes.values() if n.role == "server" and n not in lost]
        if not servers:
            raise JobFailed(f"{reason}; it was the job's last server")
        workers = [n for n in self._nodes.values() if n.role == "worker"]
        if lost and all(n.role == "server" for n in lost) and \
                all(w.moves_lost_servers for w in workers):
            self._go_on_without(lost, reason)
            return
        self._reform(reason, lost)

    def _go_on_without(self, servers: list[Node], reason: str) -> None:
        """Servers are gone from a synchronous job: the workers move their partitions
        to the servers left, which finish the interrupted rounds from what each worker
        sends again, so the generation goes on and no step is lost."""
        gone = []
        for server in servers:
            del self._nodes[server.identity]
            self._dropped.add(server.identity)
            gone.append(f"{server.host}:{server.port}")
            log.warning("the job goes on without %s: %s", server.describe(), reason)
        for worker in self._nodes.values():
            if worker.role == "worker":
                self._inbox.send(worker.identity, {"type": "server_gone", "servers": gone,
                                             "reason": reason})

    def _server_lost_by(self, worker: Node, address: object) -> None:
        """A worker's connection to a server broke without a word from it: the server
        is taken as lost (a server of another generation, or one already gone, is
        not this generation's to lose)."""
        lost = [n for n in self._nodes.values()
                if n.role == "server" and f"{n.host}:{n.port}" == address]
        if lost:
            self._lose(lost, f"{worker.describe()} lost its connection to "
                       f"{lost[0].describe()}")

    def _reform(self, reason: str, lost: list[Node]) -> None:
        """Starts the next generation: every surviving node hears why, leaves this one
        and registers again."""
        limit = self._config.elastic_reset_limit
        if limit is not None and self._generation + 1 > limit:
            raise JobFailed(f"{reason}; the job has re-formed {self._generation} time(s), and "
                            f"BYTEPS_ELASTIC_RESET_LIMIT={limit} (--reset-limit) allows no more")
        lost_ids = {node.identity for node in lost}
        survivors = {node.process: node for node in self._nodes.values()
                     if node.identity not in lost_ids and not node.done and not node.leaving}
        log.warning("the job re-forms: %s", reason)
        for node in survivors.values():
            self._inbox.send(node.identity, {"type": "reform", "reason": reason,
                                       "generation": self._generation + 1})
        self._nodes = {}
        deadline = time.monotonic() + self._config.elastic_timeout
        self._rendezvous(Gathering(self._generation + 1, deadline, survivors, reason))

    def _from_outsider(self, identity: bytes, message: dict) -> None:
        """A message from a connection of no node of this generation: a registration
        that proved the token, say. A job that is not elastic takes no one after it
        started; an elastic one re-forms at once when a survivor of this generation
        registers again (it left it), and at the workers' next commit for a newcomer."""
        kind = message["type"]
        if identity in self._launchers:
            self._from_launcher(message)
            return
        if identity in self._dropped and kind == "heartbeat":
            # Frozen a while, or cut off from the workers: the job went on without it.
            self._inbox.send(identity, {"type": "abort", "reason": "the job went on without this "
                                  "server: its workers lost their connections to it"})
            return
        if kind != "register" or self._registered(identity):
            return  # Heartbeats and farewells of nodes of an earlier generation.
        if not self._config.elastic:
            self._inbox.refuse(identity, "the job has already started: every node of it has "
                         "registered")
            return
        node = self._accept(identity, message, None)
        if node is None:
            return
        member = next((n for n in self._nodes.values() if n.process == node.process), None)
        most = self._config.elastic_max_workers
        workers = sum(n.role == "worker" for n in [*self._nodes.values(), *self._joining])
        if member is None and node.role == "worker" and most is not None and workers >= most:
            self._inbox.refuse(identity, f"the job has {workers} worker(s), as many as "
                         f"BYTEPS_ELASTIC_MAX_WORKERS={most} (--max-np) allows")
            return
        self._joining.append(node)
        if member is not None:
            lost = [n for n in self._nodes.values()
                    if n.role == "server" and f"{n.host}:{n.port}" == node.saw_lost]
            why = f" after {lost[0].describe()} went away" if lost else ""
            self._lose(lost, f"{member.describe()} left generation {self._generation} and "
                       f"registered again{why}")
            return
        self._announce_joiners()

    def _from_launcher(self, message: dict) -> None:
        """The elastic launcher's word about the workers it starts and ends."""
        names = message.get("names")
        names = {n[:300] for n in names if isinstance(n, str)} if isinstance(names, list) \
            else set()
        kind = message["type"]
        if kind == "let_go":
            self._let_workers_go(names)
        elif kind == "launching":
            self._launching |= names
            self._launched_at = time.monotonic()
        elif kind == "launch_ended":
            self._launching -= names
            self._announce_joiners()

    def _let_workers_go(self, names: set[str]) -> None:
        """The launcher's discovery script no longer lists these workers' host: every
        worker hears that hosts were removed and stops at its next commit, and the job
        re-forms without them, with no restore and no sync (Horovod's removals)."""
        leaving = [n for n in self._nodes.values() if n.role == "worker" and n.name in names]
        for node in leaving:
            node.leaving = True
            self._let_go.add(node.process)  # It registers again at the commit: refused.
            log.warning("%s leaves at the next commit: its host left the job", node.describe())
        if leaving:
            for worker in self._nodes.values():
                if worker.role == "worker":
                    self._inbox.send(worker.identity, {"type": "hosts_updated", "added": False,
                                                 "timestamp": time.time()})

    def _announce_joiners(self) -> None:
        """Workers and servers asking to join are taken in when the job's workers
        re-form, which they do together at their next commit
        (elastic.State.check_host_updates), once every worker the launcher started
        with them has registered too (or LAUNCH_WAIT_S after it started them)."""
        waited = time.monotonic() - self._launched_at
        if not self._joining or self._announced or (self._launching and
                                                    waited < LAUNCH_WAIT_S):
            return
        self._announced = True
        self._launching.clear()
        for node in self._joining:
            log.info("a %s on %s (pid %d) asks to join; the workers re-form at their next "
                     "commit", node.role, node.host, node.pid)
        for worker in self._nodes.values():
            if worker.role == "worker":
                self._inbox.send(worker.identity, {"type": "hosts_updated", "added": True,
                                             "timestamp": time.time()})

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
            if self._joining:
                self._announce_joiners()  # Once the launcher's others are in, or late.
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
            for node in list(self._nodes.values()):
                silent = now - node.last_seen
                if not node.done and silent > config.heartbeat_timeout:
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
