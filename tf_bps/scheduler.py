"""The scheduler: rendezvous and lifetime of a job. It never sees tensor data.

Start it with `DMLC_ROLE=scheduler bpslaunch` or `python -m tf_bps.scheduler`.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass

import zmq

from tf_bps.config import Config, ConfigError, configure_logging

log = logging.getLogger("tf_bps.scheduler")


@dataclass
class Node:
    identity: bytes
    role: str
    host: str
    pid: int
    port: int = 0
    local_size: int = 1
    rank: int = -1
    last_seen: float = 0.0
    done: bool = False

    def describe(self) -> str:
        name = f"worker rank {self.rank}" if self.role == "worker" else f"server {self.rank}"
        return f"{name} (pid {self.pid} on {self.host})"


class JobFailed(RuntimeError):
    pass


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


class Scheduler:
    def __init__(self, config: Config):
        self._config = config
        _, port = config.require_rendezvous()
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 2000)
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self._socket.bind(f"tcp://*:{port}")
        self._nodes: dict[bytes, Node] = {}

    def _send(self, node: Node, message: dict) -> None:
        self._socket.send_multipart([node.identity, zmq.utils.jsonapi.dumps(message)])

    def _receive(self, timeout_s: float) -> tuple[bytes, dict] | None:
        if not self._socket.poll(int(timeout_s * 1000)):
            return None
        identity, payload = self._socket.recv_multipart()
        return identity, zmq.utils.jsonapi.loads(payload)

    def run(self) -> int:
        try:
            self._rendezvous()
            self._supervise()
            return 0
        except JobFailed as error:
            log.error("%s", error)
            for node in self._nodes.values():
                self._send(node, {"type": "abort", "reason": str(error)})
            return 1
        finally:
            self._socket.close()
            self._context.term()

    # -- registration ---------------------------------------------------------------

    def _expected_workers(self, workers: list[Node]) -> int:
        local_sizes = {node.local_size for node in workers}
        if len(local_sizes) > 1:
            raise JobFailed(f"workers disagree on BYTEPS_LOCAL_SIZE: {sorted(local_sizes)}")
        return self._config.num_worker * (local_sizes.pop() if local_sizes else 1)

    def _rendezvous(self) -> None:
        config = self._config
        deadline = time.monotonic() + config.op_timeout
        servers: list[Node] = []
        workers: list[Node] = []
        while len(servers) < config.num_server or len(workers) < self._expected_workers(workers):
            remaining = deadline - time.monotonic()
            received = self._receive(max(0.0, remaining)) if remaining > 0 else None
            if received is None:
                ranks = sorted(node.rank for node in workers)
                raise JobFailed(
                    f"only {len(workers)} worker(s) (ranks {ranks}) and {len(servers)} of "
                    f"{config.num_server} server(s) registered within {config.op_timeout:g} s "
                    "(BYTEPS_OP_TIMEOUT); check DMLC_NUM_WORKER, DMLC_NUM_SERVER and that "
                    "every node reaches the scheduler")
            identity, message = received
            if message.get("type") != "register":
                continue
            node = Node(identity, message["role"], message["host"], message["pid"],
                        port=message.get("port", 0), last_seen=time.monotonic())
            if node.role == "server":
                node.rank = len(servers)
                servers.append(node)
            else:
                node.local_size = message["local_size"]
                node.rank = message["worker_id"] * node.local_size + message["local_rank"]
                clash = [w for w in workers if w.rank == node.rank]
                if clash:
                    self._send(node, {"type": "abort", "reason": (
                        f"rank {node.rank} is already taken by pid {clash[0].pid} on "
                        f"{clash[0].host}; check DMLC_WORKER_ID and BYTEPS_LOCAL_RANK")})
                    continue
                workers.append(node)
            self._nodes[identity] = node
            log.info("registered %s", node.describe())

        size = len(workers)
        addresses = [f"{s.host}:{s.port}" for s in servers]
        for server in servers:
            self._send(server, {"type": "book", "server_id": server.rank, "num_workers": size,
                                "servers": addresses})
        local = _local_placement(workers)
        for worker in workers:
            local_rank, local_size = local[worker.rank]
            self._send(worker, {"type": "book", "rank": worker.rank, "size": size,
                                "local_rank": local_rank, "local_size": local_size,
                                "servers": addresses, "workers": [
                                    w.host for w in sorted(workers, key=lambda w: w.rank)]})
        log.info("job started: %d worker(s), %d server(s)", size, len(servers))

    # -- supervision ----------------------------------------------------------------

    def _supervise(self) -> None:
        config = self._config
        while True:
            workers = [n for n in self._nodes.values() if n.role == "worker"]
            if all(n.done for n in workers):
                for node in self._nodes.values():
                    if node.role == "server":
                        self._send(node, {"type": "exit"})
                log.info("all workers finished; job complete")
                return
            received = self._receive(config.heartbeat_interval)
            now = time.monotonic()
            if received is not None:
                identity, message = received
                node = self._nodes.get(identity)
                if node is None:
                    continue
                node.last_seen = now
                kind = message.get("type")
                if kind == "heartbeat":
                    self._send(node, {"type": "heartbeat_ack"})
                elif kind == "done":
                    node.done = True
                    log.info("%s finished", node.describe())
                elif kind == "failure":
                    raise JobFailed(f"{node.describe()} reported: {message['reason']}")
            for node in self._nodes.values():
                silent = now - node.last_seen
                if not node.done and silent > config.heartbeat_timeout:
                    raise JobFailed(
                        f"{node.describe()} sent no heartbeat for {silent:.0f} s "
                        "(PS_HEARTBEAT_TIMEOUT); it has probably died")


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
