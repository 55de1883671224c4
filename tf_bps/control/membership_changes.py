"""An elastic job's membership changes (BYTEPS_ELASTIC): losses, joins, the elastic
launcher's word, and the survivors of a generation while the next one registers.

A lost worker, or one that asks to join, starts the next generation: every surviving
node hears "reform" and registers again. Workers told that the hosts changed stop
together at their next commit and register again by themselves: the job re-forms once
every one of them has left the generation, so none is cut off in the commit's last
collective by a faster one's re-forming. A synchronous job whose workers move a lost
server's partitions goes on without the server instead. Without BYTEPS_ELASTIC, any
loss ends the job.

The scheduler tells these changes what happened and forms the generations itself:
a change that needs the next generation returns the gathering to form, and one the job
cannot survive raises JobFailed.
"""

from __future__ import annotations

import logging
import time

from tf_bps.control.inbox import Inbox, quoted
from tf_bps.control.membership import Gathering, Node
from tf_bps.runtime.config import Config

log = logging.getLogger("tf_bps.scheduler")

# Workers the elastic launcher starts together join at one commit: those registered
# wait for the others this long at most (one that fails to start is reported sooner).
LAUNCH_WAIT_S = 30.0


class JobFailed(RuntimeError):
    """The job cannot go on; every node hears why."""


def _server_at(nodes: dict[bytes, Node], address: object) -> list[Node]:
    return [n for n in nodes.values() if n.role == "server" and f"{n.host}:{n.port}" == address]


def _tell_workers(nodes: dict[bytes, Node], inbox: Inbox, message: dict) -> None:
    for node in nodes.values():
        if node.role == "worker":
            inbox.send(node.identity, message)


class MembershipChanges:
    """`nodes`, wherever a method takes it: this generation's, by connection."""

    def __init__(self, config: Config, inbox: Inbox):
        self._config = config
        self._inbox = inbox
        # Workers and servers that asked to join, waiting for the next generation.
        self._joining: list[Node] = []
        self._announced = False  # the joiners were announced to this generation
        # This generation's workers were told the hosts changed: they stop at their next
        # commit. Those that left it there (by process: registered again, or refused as
        # let go), since when, and the registrations of those that registered again.
        self._stopping = False
        self._left: set[tuple[str, int]] = set()
        self._first_left_at = 0.0
        self._held: list[Node] = []
        # An elastic launcher's connections (--host-discovery-script), and the workers
        # it let go (by process), which must not register again.
        self._launchers: set[bytes] = set()
        self._let_go: set[tuple[str, int]] = set()
        # Workers the launcher started together while the job runs (by name), not yet
        # registered: the workers re-form once all of them are in (or LAUNCH_WAIT_S
        # after the launch), so that a host's workers join at one commit.
        self._launching: set[str] = set()
        self._launched_at = 0.0
        # Servers the job went on without (by connection): told to stop if they speak.
        self._dropped: set[bytes] = set()

    # -- what the scheduler asks -------------------------------------------------------

    @property
    def joining(self) -> list[Node]:
        """Those waiting for the next generation (not to be changed)."""
        return self._joining

    def is_launcher(self, identity: bytes) -> bool:
        return identity in self._launchers

    def let_go_registers_again(self, process: tuple[str, int]) -> bool:
        """Whether `process`, registering again, was let go (to be refused); if so, it has
        left its generation."""
        if process in self._let_go:
            self._left_at_commit(process)
            return True
        return False

    def has_left(self, node: Node) -> bool:
        """Whether `node` left this generation at the commit where the workers stop:
        its heartbeats ended with it."""
        return node.process in self._left

    def connections(self) -> set[bytes]:
        """The connections heard besides a generation's nodes: launchers and joiners."""
        return {*self._launchers, *(node.identity for node in self._joining)}

    # -- what the scheduler tells --------------------------------------------------------

    def launcher_connected(self, identity: bytes) -> None:
        self._launchers.add(identity)

    def registered(self, node: Node) -> None:
        """`node` registered: one of the launcher's, it is no longer waited for."""
        self._launching.discard(node.name)

    def defer(self, node: Node) -> None:
        """`node` joins the next generation, not the one registering now."""
        self._joining.append(node)

    def take_joiners(self) -> list[Node]:
        """Those waiting, for the generation that registers now."""
        joiners, self._joining = self._joining, []
        return joiners

    def formed(self, nodes: dict[bytes, Node]) -> None:
        """A generation formed: it has heard of no joiner yet."""
        self._announced = self._stopping = False
        self._left.clear()
        self.announce_joiners(nodes)

    def from_launcher(self, message: dict, nodes: dict[bytes, Node]) -> None:
        """The elastic launcher's word about the workers it starts and ends."""
        names = message.get("names")
        names = {n[:300] for n in names if isinstance(n, str)} if isinstance(names, list) \
            else set()
        kind = message["type"]
        if kind == "let_go":
            self._let_workers_go(names, nodes)
        elif kind == "launching":
            self._launching |= names
            self._launched_at = time.monotonic()
        elif kind == "launch_ended":
            self._launching -= names
            self.announce_joiners(nodes)

    def announce_joiners(self, nodes: dict[bytes, Node]) -> None:
        """Workers and servers asking to join are taken in when the job's workers
        re-form, which they do together at their next commit
        (elastic.State.check_host_updates), once every worker the launcher started
        with them has registered too (or LAUNCH_WAIT_S after it started them)."""
        waited = time.monotonic() - self._launched_at
        if not self._joining or self._announced or (self._launching and
                                                    waited < LAUNCH_WAIT_S):
            return
        self._announced = self._stopping = True
        self._launching.clear()
        for node in self._joining:
            log.info("a %s on %s (pid %d) asks to join; the workers re-form at their next "
                     "commit", node.role, node.host, node.pid)
        _tell_workers(nodes, self._inbox, {"type": "hosts_updated", "added": True,
                                           "timestamp": time.time()})

    def turned_away(self, identity: bytes, kind: str) -> bool:
        """Whether a message came from a server the job went on without: it hears so."""
        if identity not in self._dropped or kind != "heartbeat":
            return False
        # Frozen a while, or cut off from the workers: the job went on without it.
        self._inbox.send(identity, {"type": "abort", "reason": "the job went on without this "
                                    "server: its workers lost their connections to it"})
        return True

    def join(self, node: Node, nodes: dict[bytes, Node], generation: int) -> Gathering | None:
        """A registration (accepted) while generation `generation` runs: a newcomer
        waits for the workers' next commit; a node of this generation registering again
        left it, so the job re-forms at once (the next generation's gathering)."""
        member = next((n for n in nodes.values() if n.process == node.process), None)
        most = self._config.elastic_max_workers
        workers = sum(n.role == "worker" for n in [*nodes.values(), *self._joining])
        if member is None and node.role == "worker" and most is not None and workers >= most:
            self._inbox.refuse(node.identity, f"the job has {workers} worker(s), as many as "
                               f"BYTEPS_ELASTIC_MAX_WORKERS={most} (--max-np) allows")
            return None
        lost = _server_at(nodes, node.saw_lost)
        if member is not None and self._stopping and not lost:
            self._held.append(node)
            self._left_at_commit(node.process)
            return self.reform_once_all_left(nodes, generation)
        self._joining.append(node)
        if member is None:
            self.announce_joiners(nodes)
            return None
        why = f" after {lost[0].describe()} went away" if lost else ""
        return self.lose(nodes, generation, lost, f"{member.describe()} left generation "
                         f"{generation} and registered again{why}")

    def lose(self, nodes: dict[bytes, Node], generation: int, lost: list[Node],
             reason: str) -> Gathering | None:
        """Workers or servers of generation `generation` are gone: the job fails, or an
        elastic one goes on, while it has a server left. None: it goes on without lost
        servers (gone from `nodes`); otherwise the next generation's gathering, whose
        survivors heard "reform"."""
        if not self._config.elastic:
            raise JobFailed(reason)
        servers = [n for n in nodes.values() if n.role == "server" and n not in lost]
        if not servers:
            raise JobFailed(f"{reason}; it was the job's last server")
        workers = [n for n in nodes.values() if n.role == "worker"]
        if lost and all(n.role == "server" for n in lost) and \
                all(w.moves_lost_servers for w in workers):
            self._go_on_without(nodes, lost, reason)
            return None
        return self._reform(nodes, generation, reason, lost)

    def reform_once_all_left(self, nodes: dict[bytes, Node], generation: int
                             ) -> Gathering | None:
        """Once a worker left generation `generation` at the commit where the workers
        stop, the next generation's gathering when every other worker has left it too
        (registered again, finished, or let go), or a heartbeat timeout after the first
        left, when the ones still in it hear "reform"; None before."""
        if not self._left:
            return None
        staying = [n for n in nodes.values() if n.role == "worker" and not n.done and
                   n.process not in self._left]
        waited = time.monotonic() - self._first_left_at
        if staying and waited < self._config.heartbeat_timeout:
            return None
        reason = f"its workers left generation {generation} at a commit: the hosts changed"
        if staying:
            reason += (f"; {', '.join(n.describe() for n in staying)} did not within "
                       f"{waited:.0f} s")
        return self.lose(nodes, generation, [], reason)

    def turn_away(self, reason: str) -> None:
        """An elastic job's workers may be between two registrations when it fails:
        for a heartbeat timeout, every connection that proved the job's token and says
        anything hears why, instead of waiting for an address book that will never come
        (a stranger hears nothing of it)."""
        deadline = time.monotonic() + self._config.heartbeat_timeout
        while (remaining := deadline - time.monotonic()) > 0:
            received = self._inbox.receive(remaining)
            if received is not None and self._inbox.proven(received[0]):
                self._inbox.send(received[0], {"type": "abort", "reason": reason})

    # -- the survivors of the last generation, while the next registers -----------------

    def hear_from_survivor(self, identity: bytes, message: dict,
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

    def drop_silent_survivors(self, gathering: Gathering) -> None:
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

    def can_form_without_the_missing(self, gathering: Gathering) -> bool:
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

    # -- the changes -------------------------------------------------------------------

    def _go_on_without(self, nodes: dict[bytes, Node], servers: list[Node],
                       reason: str) -> None:
        """Servers are gone from a synchronous job: the workers move their partitions
        to the servers left, which finish the interrupted rounds from what each worker
        sends again, so the generation goes on and no step is lost."""
        gone = []
        for server in servers:
            del nodes[server.identity]
            self._dropped.add(server.identity)
            gone.append(f"{server.host}:{server.port}")
            log.warning("the job goes on without %s: %s", server.describe(), reason)
        _tell_workers(nodes, self._inbox, {"type": "server_gone", "servers": gone,
                                           "reason": reason})

    def _reform(self, nodes: dict[bytes, Node], generation: int, reason: str,
                lost: list[Node]) -> Gathering:
        """The next generation: every surviving node hears why, leaves this one and
        registers again."""
        limit = self._config.elastic_reset_limit
        if limit is not None and generation + 1 > limit:
            raise JobFailed(f"{reason}; the job has re-formed {generation} time(s), and "
                            f"BYTEPS_ELASTIC_RESET_LIMIT={limit} (--reset-limit) allows no more")
        self._joining.extend(self._held)
        self._held.clear()
        self._left.clear()
        lost_ids = {node.identity for node in lost}
        survivors = {node.process: node for node in nodes.values()
                     if node.identity not in lost_ids and not node.done and not node.leaving}
        log.warning("the job re-forms: %s", reason)
        for node in survivors.values():
            self._inbox.send(node.identity, {"type": "reform", "reason": reason,
                                             "generation": generation + 1})
        deadline = time.monotonic() + self._config.elastic_timeout
        return Gathering(generation + 1, deadline, survivors, reason)

    def _let_workers_go(self, names: set[str], nodes: dict[bytes, Node]) -> None:
        """The launcher's discovery script no longer lists these workers' host."""
        self.let_go([n for n in nodes.values() if n.role == "worker" and n.name in names],
                    nodes, "its host left the job")

    def let_go(self, leaving: list[Node], nodes: dict[bytes, Node], why: str) -> None:
        """These workers leave (their host left, or they were told to stop): every worker
        hears that hosts were removed and stops at its next commit, and the job re-forms
        without them, with no restore and no sync (Horovod's removals)."""
        leaving = [node for node in leaving if not node.leaving]
        for node in leaving:
            node.leaving = True
            self._let_go.add(node.process)  # Should it register again: refused.
            log.warning("%s leaves at the next commit: %s", node.describe(), why)
        if not leaving:
            return
        self._stopping = True
        timestamp = time.time()
        for node in nodes.values():
            if node.role == "worker":
                # Those leaving hear so: they end at the commit instead of registering.
                self._inbox.send(node.identity, {"type": "hosts_updated", "added": False,
                                                 "timestamp": timestamp,
                                                 **({"leaving": why} if node.leaving else {})})

    def _left_at_commit(self, process: tuple[str, int]) -> None:
        if not self._stopping:
            return
        if not self._left:
            self._first_left_at = time.monotonic()
        self._left.add(process)
