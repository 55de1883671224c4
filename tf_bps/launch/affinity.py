"""Core affinity for the workers a launcher starts on one host, by BytePS's rules
(BYTEPS_NUMA_ON and the variables beside it, parsed in config.py):

- BYTEPS_VISIBLE_CPU_CORES lists each local worker's cores: it is used as given.
- Otherwise each worker gets BYTEPS_NUMA_DEFAULT_QUOTA physical cores (default: the
  host's physical cores, less BYTEPS_CPU_BLACKLIST, shared evenly), on the NUMA node of
  its GPU where that is known (else the workers are spread over the nodes in order),
  never a core another worker has, and with BYTEPS_MULTITHREADED_CPU=1 every hyperthread
  of those cores. Hyperthreads are read from the kernel's topology, not assumed.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass

from tf_bps.runtime.config import Config, ConfigError, read_cpu_list, visible_gpus


@dataclass(frozen=True)
class Topology:
    cores: tuple[tuple[int, ...], ...]  # each physical core's logical CPUs, ascending
    nodes: tuple[int, ...]  # the NUMA node of each core


def read_topology(root: str = "/sys/devices/system") -> Topology:
    """This host's physical cores and NUMA nodes; each CPU its own core on node 0 where
    the kernel does not say."""
    online = sorted(os.sched_getaffinity(0))
    node_of_cpu = {}
    for path in glob.glob(f"{root}/node/node[0-9]*/cpulist"):
        node = int(path.split("/node/node")[1].split("/")[0])
        with open(path) as listing:
            for cpu in read_cpu_list(listing.read()):
                node_of_cpu[cpu] = node
    cores: dict[tuple[int, ...], None] = {}
    for cpu in online:
        try:
            with open(f"{root}/cpu/cpu{cpu}/topology/thread_siblings_list") as listing:
                siblings = tuple(sorted(read_cpu_list(listing.read()) & set(online)))
        except (OSError, ValueError):
            siblings = (cpu,)
        cores[siblings or (cpu,)] = None
    ordered = tuple(sorted(cores))
    return Topology(ordered, tuple(node_of_cpu.get(core[0], 0) for core in ordered))


def gpu_numa_nodes(config_env) -> list[int | None]:
    """The NUMA node of each visible GPU, in CUDA_VISIBLE_DEVICES order; None where
    unknown (no nvidia-smi, or the kernel does not say)."""
    gpus = visible_gpus(config_env)
    if not gpus or not shutil.which("nvidia-smi"):
        return []
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    bus_of = {}
    for line in listing.splitlines():
        index, uuid, bus = (field.strip() for field in line.split(","))
        bus_of[index] = bus_of[uuid] = bus.lower()[-12:]  # 0000:3b:00.0
    nodes = []
    for gpu in gpus:
        try:
            with open(f"/sys/bus/pci/devices/{bus_of[gpu]}/numa_node") as node:
                value = int(node.read())
            nodes.append(value if value >= 0 else None)
        except (KeyError, OSError, ValueError):
            nodes.append(None)
    return nodes


def plan_cores(config: Config, local_size: int, topology: Topology | None = None,
               gpu_nodes: list[int | None] | None = None) -> list[frozenset[int]] | None:
    """Each local worker's CPUs, by local rank; None: leave them unpinned."""
    if not config.numa_on or local_size < 1:
        return None
    topology = topology or read_topology()
    if config.visible_cpu_cores is not None:
        if len(config.visible_cpu_cores) != local_size:
            raise ConfigError(
                f"BYTEPS_VISIBLE_CPU_CORES has {len(config.visible_cpu_cores)} section(s) but "
                f"this host runs {local_size} worker(s): give one colon-separated list each")
        present = {cpu for core in topology.cores for cpu in core}
        for cores in config.visible_cpu_cores:
            if not cores <= present:
                raise ConfigError(
                    f"BYTEPS_VISIBLE_CPU_CORES names CPU {min(cores - present)}, which this host "
                    f"does not offer (it has {_cpu_text(present)})")
        return list(config.visible_cpu_cores)
    usable = [(tuple(c for c in core if c not in config.cpu_blacklist), node)
              for core, node in zip(topology.cores, topology.nodes, strict=True)]
    usable = [(core, node) for core, node in usable if core]
    quota = config.numa_quota or len(usable) // local_size
    if config.numa_quota and quota * local_size > len(usable):
        raise ConfigError(
            f"BYTEPS_NUMA_DEFAULT_QUOTA={quota} is not valid here: {local_size} worker(s) need "
            f"{quota * local_size} physical cores and {len(usable)} are usable")
    if quota < 1:
        return None  # Fewer cores than workers: pinning would only stack them up.
    nodes = sorted(set(node for _, node in usable))
    gpu_nodes = gpu_nodes if gpu_nodes is not None else []
    plans = []
    for rank in range(local_size):
        node = gpu_nodes[rank] if rank < len(gpu_nodes) and gpu_nodes[rank] is not None \
            else nodes[rank * len(nodes) // local_size]
        preferred = [c for c in usable if c[1] == node] + [c for c in usable if c[1] != node]
        taken = preferred[:quota]
        for core in taken:
            usable.remove(core)
        plans.append(frozenset(cpu for core, _ in taken
                               for cpu in (core if config.multithreaded_cpu else core[:1])))
    return plans


def _cpu_text(cpus) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))
