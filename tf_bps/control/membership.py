"""Who is in a job and how they are numbered: the nodes of a generation, the
registrations gathered for the next one, and the address books that tell each node
its rank, its host's workers and the servers (scheduler.py keeps the socket)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Node:
    identity: bytes
    role: str
    host: str
    pid: int
    port: int = 0
    local_size: int = 1
    merge_mode: str = "0"  # BYTEPS_LOCAL_MERGE: auto, 1 or 0 (_merges)
    rank: int = -1
    last_seen: float = 0.0
    done: bool = False
    # Its rank in the generation before, when it survived one; -1 for a newcomer.
    previous_rank: int = -1
    # A worker registering again names the server ("host:port") it saw go away.
    saw_lost: str = ""
    name: str = ""  # what the elastic launcher calls a worker (BYTEPS_ELASTIC_WORKER_NAME)
    leaving: bool = False  # its host left the job: it goes at the workers' next commit
    # A worker of a synchronous elastic job: it moves a lost server's partitions to the
    # servers left when the scheduler says so (the job goes on without a new generation).
    moves_lost_servers: bool = False

    @property
    def process(self) -> tuple[str, int]:
        """What names the process across generations (it registers anew in each)."""
        return self.host, self.pid

    def describe(self) -> str:
        name = f"worker rank {self.rank}" if self.role == "worker" else f"server {self.rank}"
        return f"{name} (pid {self.pid} on {self.host})"


def _local_placement(workers: list[Node]) -> dict[int, tuple[int, int]]:
    """rank -> (local rank, local size): each worker's index, in rank order, among the
    workers that advertise the same host, and their count. This is what pins one GPU
    per process, whatever started the workers (bpslaunch -np, BYTEPS_LOCAL_* or a
    cluster manager)."""
    by_host: dict[str, list[int]] = {}
    for worker in sorted(workers, key=lambda w: w.rank):
        by_host.setdefault(worker.host, []).append(worker.rank)
    return {rank: (index, len(ranks)) for ranks in by_host.values()
            for index, rank in enumerate(ranks)}


def _merges(worker: Node, server_hosts: list[str]) -> bool:
    """Whether `worker` merges: always with BYTEPS_LOCAL_MERGE=1; by default only where
    a server is on another host. A merge costs a copy and a hop through the leader, and
    pays for them in the bytes it keeps off a network link; with every server on the
    workers' host it saves none, and push_pull_benchmark.py measures no gain there."""
    if worker.merge_mode == "1":
        return True
    return worker.merge_mode == "auto" and any(host != worker.host for host in server_hosts)


def _merge_groups(workers: list[Node], server_hosts: list[str]) -> list[int]:
    """By rank, a number per group of workers that merge push_pull partitions before
    pushing them (custom_ops/worker/local_merge.h): those of one host that all merge
    (_merges); a worker that does not is a group of its own. Workers and servers get
    the same numbers, so the servers count a host's merged push for exactly its group."""
    numbers: dict[str, int] = {}
    groups = []
    for worker in sorted(workers, key=lambda w: w.rank):
        key = worker.host if _merges(worker, server_hosts) else f"rank {worker.rank}"
        groups.append(numbers.setdefault(key, len(numbers)))
    return groups


@dataclass
class Gathering:
    """The registrations of one generation, until its address books go out."""

    number: int
    deadline: float
    # A re-forming: the last generation's nodes still expected, by process; each
    # registers anew. Empty for the first generation, which counts by its ids.
    survivors: dict[tuple[str, int], Node]
    reason: str = ""
    servers: list[Node] = field(default_factory=list)
    workers: list[Node] = field(default_factory=list)

    @property
    def first(self) -> bool:
        return self.number == 0

    def missing(self) -> list[Node]:
        joined = {node.process for node in self.servers + self.workers}
        return [node for key, node in self.survivors.items() if key not in joined]


def address_books(gathering: Gathering) -> list[tuple[bytes, dict]]:
    """Numbers a generation's nodes (the first keeps the ranks its ids gave; a later
    one puts survivors first, in their old order, so rank 0 stays where it was if it
    lives) and returns each node's address book, by its connection."""
    def order(node: Node) -> tuple[int, int]:
        return (0, node.previous_rank) if node.previous_rank >= 0 else (1, 0)

    servers, workers = gathering.servers, gathering.workers
    if not gathering.first:
        servers.sort(key=order)
        workers.sort(key=order)
        for rank, node in enumerate(servers):
            node.rank = rank
        for rank, node in enumerate(workers):
            node.rank = rank
    size = len(workers)
    addresses = [f"{s.host}:{s.port}" for s in servers]
    hosts = [w.host for w in sorted(workers, key=lambda w: w.rank)]
    groups = _merge_groups(workers, [s.host for s in servers])
    books = [(server.identity, {"type": "book", "server_id": server.rank, "num_workers": size,
                                "servers": addresses, "merge_groups": groups, "workers": hosts,
                                "generation": gathering.number}) for server in servers]
    local = _local_placement(workers)
    for worker in workers:
        local_rank, local_size = local[worker.rank]
        books.append((worker.identity, {
            "type": "book", "rank": worker.rank, "size": size, "local_rank": local_rank,
            "local_size": local_size, "servers": addresses, "workers": hosts,
            "merge_with": [r for r in range(size) if groups[r] == groups[worker.rank]],
            "generation": gathering.number}))
    return books
