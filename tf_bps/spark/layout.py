"""How the tasks of a Spark barrier stage become a tf_bps job. Pure: it reads the task
addresses Spark gives every barrier task and starts nothing, so each task computes
the same layout on its own.

A task's rank is its partition id, as in Horovod, so results come back in partition
order. tf_bps numbers ranks host by host with the same count on every host
(DMLC_NUM_WORKER hosts of BYTEPS_LOCAL_SIZE workers). When Spark placed the partitions
that way, that is the job, and the workers of a host merge their gradients before
pushing. When it did not (partitions interleaved over executors, or more on one host
than on another), every task is a tf_bps host of its own: still correct, only without
the merge. Either way each machine runs one server, started by its lowest partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SparkLayout:
    """The job over `hosts[p]`, the machine of partition p."""

    hosts: tuple[str, ...]  # by partition: the executor's address, without its port
    local_size: int  # workers per tf_bps host (1 when Spark's placement is uneven)
    reason: str = ""  # why local_size fell back to 1, for the driver's message

    @property
    def num_proc(self) -> int:
        return len(self.hosts)

    @property
    def machines(self) -> tuple[str, ...]:
        """The distinct machines, in the order of their lowest partition."""
        return tuple(dict.fromkeys(self.hosts))

    @property
    def distributed(self) -> bool:
        """One task alone needs no scheduler or server (push_pull is then local)."""
        return self.num_proc > 1

    def starts_server(self, partition: int) -> bool:
        """Whether this partition is the lowest on its machine (which runs one server)."""
        return self.distributed and self.hosts.index(self.hosts[partition]) == partition

    def variables(self, partition: int) -> dict[str, str]:
        """What places partition's worker in the job (the scheduler's address and the
        token come from the driver)."""
        host, local_rank = divmod(partition, self.local_size)
        variables = {
            "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(host),
            "DMLC_NUM_WORKER": str(self.num_proc // self.local_size),
            "BYTEPS_LOCAL_RANK": str(local_rank), "BYTEPS_LOCAL_SIZE": str(self.local_size),
            # What horovodrun tells each process, for scripts that read it.
            "HOROVOD_RANK": str(partition), "HOROVOD_SIZE": str(self.num_proc),
            "HOROVOD_LOCAL_RANK": str(local_rank),
            "HOROVOD_LOCAL_SIZE": str(self.local_size),
            "HOROVOD_HOSTNAME": self.hosts[partition],
        }
        if self.distributed:
            variables["DMLC_NUM_SERVER"] = str(len(self.machines))
            variables["DMLC_NODE_HOST"] = self.hosts[partition]
        return variables

    def server_variables(self, partition: int) -> dict[str, str]:
        """The variables of the server that `partition` starts beside its worker."""
        return {"DMLC_ROLE": "server", "DMLC_NUM_WORKER": str(self.num_proc // self.local_size),
                "DMLC_NUM_SERVER": str(len(self.machines)),
                "DMLC_NODE_HOST": self.hosts[partition]}


def host_of(address: str) -> str:
    """`host:port` (IPv6 in brackets or not) -> host."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit():
        return address
    return host.strip("[]")


def plan_layout(addresses: Sequence[str]) -> SparkLayout:
    """The layout of the tasks whose executor addresses (BarrierTaskInfo.address, by
    partition) are `addresses`."""
    if not addresses:
        raise ValueError("a job needs at least one task")
    hosts = tuple(host_of(address) for address in addresses)
    by_host: dict[str, list[int]] = {}
    for partition, host in enumerate(hosts):
        by_host.setdefault(host, []).append(partition)
    counts = {len(partitions) for partitions in by_host.values()}
    if len(counts) > 1:
        found = ", ".join(f"{len(p)} on {h}" for h, p in by_host.items())
        return SparkLayout(hosts, 1, f"Spark placed the tasks unevenly ({found})")
    local_size = counts.pop()
    for index, partitions in enumerate(by_host.values()):
        if partitions != list(range(index * local_size, (index + 1) * local_size)):
            return SparkLayout(hosts, 1, "Spark did not place the partitions host by host "
                               f"({', '.join(f'{h}: {p}' for h, p in by_host.items())})")
    return SparkLayout(hosts, local_size)
