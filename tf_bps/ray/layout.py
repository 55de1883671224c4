"""How the workers Ray placed become a tf_bps job: ranks, hosts and each process's
variables. Pure: it reads what the actors said of their nodes and starts nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerNode:
    """What one worker actor found out about where Ray put it."""

    node_id: str  # Ray's node id: two nodes may share an address (a local test cluster)
    address: str  # the node's IP, which its servers and workers advertise
    gpu_ids: tuple[str, ...] = ()  # the GPUs Ray gave this actor


@dataclass(frozen=True)
class JobLayout:
    """The job over the actors: `actor_of_rank[r]` is the index (in the order the actors
    were created) of the actor that is rank r; ranks run node by node."""

    actor_of_rank: tuple[int, ...]
    nodes: tuple[str, ...]  # the worker nodes' ids, in rank order; one server each
    addresses: tuple[str, ...]  # their addresses, alike
    local_size: int  # workers per host in tf_bps's sense (1 when nodes are uneven)
    variables: tuple[dict[str, str], ...]  # by rank: what places that worker in the job

    @property
    def num_workers(self) -> int:
        return len(self.actor_of_rank)


def plan_job(workers: Sequence[WorkerNode]) -> JobLayout:
    """Ranks node by node, in the order nodes first appear among the actors.

    tf_bps runs DMLC_NUM_WORKER hosts of BYTEPS_LOCAL_SIZE workers each. When Ray put the
    same number of workers on every node, that is the job (one worker per node then merges
    the node's gradients, as under bpslaunch -H). When it did not (PACK fills nodes
    unevenly), every worker is a host of its own: still correct, without the merge."""
    if not workers:
        raise ValueError("a job needs at least one worker")
    by_node: dict[str, list[int]] = {}
    for index, worker in enumerate(workers):
        by_node.setdefault(worker.node_id, []).append(index)
    counts = {len(indices) for indices in by_node.values()}
    order = [index for indices in by_node.values() for index in indices]
    local_size = counts.pop() if len(counts) == 1 else 1
    nodes = tuple(by_node)
    variables = []
    for rank, index in enumerate(order):
        worker = workers[index]
        local_rank = by_node[worker.node_id].index(index)
        host, local = divmod(rank, local_size)
        variables.append({
            "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(host),
            "DMLC_NUM_WORKER": str(len(workers) // local_size),
            "BYTEPS_LOCAL_RANK": str(local), "BYTEPS_LOCAL_SIZE": str(local_size),
            "DMLC_NODE_HOST": worker.address,
            # What horovodrun tells each process, for scripts that read it.
            "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(len(workers)),
            "HOROVOD_LOCAL_RANK": str(local_rank),
            "HOROVOD_LOCAL_SIZE": str(len(by_node[worker.node_id])),
        })
        if local_size > 1:
            variables[-1].update(_visible_gpus(workers, by_node[worker.node_id]))
    return JobLayout(tuple(order), nodes, tuple(workers[by_node[n][0]].address for n in nodes),
                     local_size, tuple(variables))


def _visible_gpus(workers: Sequence[WorkerNode], node_actors: list[int]) -> dict[str, str]:
    """Ray shows each actor only its own GPUs. With several workers on a host, tf_bps pins
    local rank i to the host's i-th visible GPU, and the host's workers reach each other's
    GPUs, so every worker of a node sees the node's workers' GPUs, in local-rank order.
    (A worker that is a host of its own keeps the GPUs Ray gave it.)"""
    gpus = [gpu for index in node_actors for gpu in workers[index].gpu_ids]
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}
