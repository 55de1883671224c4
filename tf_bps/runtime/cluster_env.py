"""Where a process started by a cluster manager stands in a job, with no bpslaunch.
Reads only the variables it is handed; starts nothing (launch/agent.py starts the
helpers a placement asks for).

MPI launchers (Open MPI's OMPI_COMM_WORLD_*, MPICH and Intel MPI's PMI_*), Slurm's srun
(SLURM_*), Kubeflow's TFJob (TF_CONFIG), a Kubernetes Indexed Job (JOB_COMPLETION_INDEX)
and a Volcano job (VC_*) each tell every process its rank and the job's shape in their
own variables. `placement` translates them into the DMLC_*/BYTEPS_*
variables tf_bps reads, and says which helper processes this one must start: the
scheduler (on rank 0, or TF_CONFIG's first task) and a server beside the workers of
each host (on local rank 0), unless the job names its servers.

Variables the user sets win over the implied ones, and DMLC_ROLE set means the job was
described by hand or by bpslaunch: then nothing is implied.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

# A port every process of a job derives alike from the manager's job id, when the user
# gives no DMLC_PS_ROOT_PORT.
_PORT_BASE, _PORT_SPAN = 20000, 40000


class ClusterError(ValueError):
    """The manager's variables do not describe a job tf_bps can run; says why."""


@dataclass(frozen=True)
class Placement:
    manager: str  # "mpirun", "Slurm", "TF_CONFIG": for messages
    variables: dict[str, str]  # the implied DMLC_*/BYTEPS_* variables
    starts_scheduler: bool = False
    starts_server: bool = False


def placement(env: Mapping[str, str]) -> Placement | None:
    """This process's place as its cluster manager describes it; None without one."""
    if env.get("DMLC_ROLE", "").strip():
        return None
    if "OMPI_COMM_WORLD_RANK" in env:
        manager, names = "mpirun", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
        return _ranked(manager, env, *(_number(env, n, manager) for n in names),
                       job_id=env.get("OMPI_MCA_ess_base_jobid"))
    if "PMI_RANK" in env:
        manager, names = "mpirun (PMI)", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
                                          "MPI_LOCALNRANKS")
        return _ranked(manager, env, *(_number(env, n, manager) for n in names),
                       job_id=env.get("PMI_JOBID"))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        size = _number(env, "SLURM_NTASKS", "Slurm")
        # srun spreads tasks evenly over the step's nodes, or _ranked refuses it.
        nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST", ""))
        local_size = size // max(1, len(nodes))
        return _ranked("Slurm", env, _number(env, "SLURM_PROCID", "Slurm"), size,
                       _number(env, "SLURM_LOCALID", "Slurm"), local_size,
                       job_id=f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}",
                       nodes=nodes)
    if env.get("TF_CONFIG", "").strip():
        return _tf_config(env)
    if "VC_TASK_INDEX" in env and any(name in env for name in _VOLCANO_WORKERS):
        return _volcano(env)
    if "JOB_COMPLETION_INDEX" in env:
        return _indexed_job(env)
    return None


def _number(env: Mapping[str, str], name: str, manager: str) -> int:
    raw = env.get(name, "").strip()
    if not raw.isdigit():
        raise ClusterError(f"{name}={raw!r} (set by {manager}) is not a number")
    return int(raw)


def _ranked(manager: str, env: Mapping[str, str], rank: int, size: int, local_rank: int,
            local_size: int, job_id: str | None, nodes: list[str] | None = None) -> Placement:
    if not (0 <= rank < size and 0 <= local_rank < local_size and size % local_size == 0
            and rank % local_size == local_rank):
        raise ClusterError(
            f"{manager} placed rank {rank} of {size} as local rank {local_rank} of "
            f"{local_size}: tf_bps needs the same number of processes on every host, ranks "
            "numbered host by host (Open MPI's default --map-by slot, Slurm's block "
            "distribution)")
    hosts = size // local_size
    implied = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": str(hosts),
               "DMLC_WORKER_ID": str(rank // local_size),
               "BYTEPS_LOCAL_SIZE": str(local_size), "BYTEPS_LOCAL_RANK": str(local_rank)}
    if hosts == 1:
        implied["DMLC_PS_ROOT_URI"] = "127.0.0.1"
    elif nodes:
        implied["DMLC_PS_ROOT_URI"] = nodes[0]
    elif not env.get("DMLC_PS_ROOT_URI", "").strip():
        raise ClusterError(
            f"under {manager} across hosts, set DMLC_PS_ROOT_URI to the address of the host "
            "of rank 0, where the scheduler starts (mpirun -x DMLC_PS_ROOT_URI=host1 ...)")
    return _with_helpers(manager, env, implied, job_id, is_first=rank == 0,
                         is_host_leader=local_rank == 0, colocated_servers=hosts)


def _with_helpers(manager: str, env: Mapping[str, str], implied: dict[str, str],
                  job_id: str | None, is_first: bool, is_host_leader: bool,
                  colocated_servers: int) -> Placement:
    if not env.get("DMLC_PS_ROOT_PORT", "").strip() and "DMLC_PS_ROOT_PORT" not in implied:
        if not job_id or not job_id.strip("."):
            raise ClusterError(f"{manager} gives no job id to derive the scheduler's port "
                               "from: set DMLC_PS_ROOT_PORT")
        digits = sum(ord(c) * 31**i for i, c in enumerate(job_id)) % _PORT_SPAN
        implied["DMLC_PS_ROOT_PORT"] = str(_PORT_BASE + digits)
    # Servers the job names (DMLC_NUM_SERVER, TF_CONFIG's ps tasks) are started by
    # whoever placed them.
    own_servers = not (env.get("DMLC_NUM_SERVER", "").strip() or "DMLC_NUM_SERVER" in implied)
    if own_servers:
        implied["DMLC_NUM_SERVER"] = str(colocated_servers)
    return Placement(manager, implied, starts_scheduler=is_first,
                     starts_server=own_servers and is_host_leader)


def _tf_config(env: Mapping[str, str]) -> Placement:
    """Kubeflow's TFJob: chief and worker tasks are workers (chief first), ps tasks are
    servers (without any, every worker task runs one beside it), and the first task
    also runs the scheduler, at its own address."""
    try:
        tf_config = json.loads(env["TF_CONFIG"])
        cluster, task = tf_config["cluster"], tf_config["task"]
        kind, index = task["type"], int(task["index"])
        workers = [*cluster.get("chief", []), *cluster.get("worker", [])]
        servers = list(cluster.get("ps", []))
        if not all(isinstance(a, str) for a in workers + servers):
            raise TypeError("task addresses must be strings")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ClusterError(f"TF_CONFIG is not valid: {error!s}") from None
    if kind not in ("chief", "worker", "ps"):
        raise ClusterError(f"TF_CONFIG task type {kind!r} takes no part in a tf_bps job (its "
                           "tasks are chief, worker and ps)")
    if not workers:
        raise ClusterError("TF_CONFIG lists no chief or worker task")
    members = {"chief": cluster.get("chief", []), "worker": cluster.get("worker", []),
               "ps": servers}[kind]
    if not 0 <= index < len(members):
        raise ClusterError(f"TF_CONFIG task {kind} {index} is not in its cluster")
    root_host, _, root_port = workers[0].rpartition(":")
    if not root_host or not root_port.isdigit():
        raise ClusterError(f"TF_CONFIG address {workers[0]!r} is not host:port")
    rank = index + (len(cluster.get("chief", [])) if kind == "worker" else 0)
    implied = {"DMLC_NUM_WORKER": str(len(workers)), "BYTEPS_LOCAL_SIZE": "1",
               "DMLC_PS_ROOT_URI": root_host, "DMLC_PS_ROOT_PORT": root_port}
    if kind == "ps":
        implied.update(DMLC_ROLE="server", DMLC_NUM_SERVER=str(len(servers)))
        return Placement("TF_CONFIG", implied)
    implied.update(DMLC_ROLE="worker", DMLC_WORKER_ID=str(rank), BYTEPS_LOCAL_RANK="0")
    if servers:
        implied["DMLC_NUM_SERVER"] = str(len(servers))
    return _with_helpers("TF_CONFIG", env, implied, None, is_first=rank == 0,
                         is_host_leader=True, colocated_servers=len(workers))


def _indexed_job(env: Mapping[str, str]) -> Placement:
    """A Kubernetes Indexed Job of worker pods (or a JobSet's), one worker each, behind a
    headless Service: the completion index is the rank. Kubernetes tells a pod neither the
    job's size nor its Service, so the manifest gives DMLC_NUM_WORKER (the completions)
    and DMLC_PS_ROOT_URI (pod 0's name in the Service, `<job>-0.<service>`). Pod 0 runs
    the scheduler, and every pod a server unless the job names its server pods."""
    manager = "a Kubernetes Indexed Job"
    index = _number(env, "JOB_COMPLETION_INDEX", manager)
    if not env.get("DMLC_NUM_WORKER", "").strip():
        raise ClusterError(f"in {manager}, set DMLC_NUM_WORKER to the job's completions "
                           "(Kubernetes does not tell a pod how many there are)")
    size = _number(env, "DMLC_NUM_WORKER", manager)
    if not 0 <= index < size:
        raise ClusterError(f"JOB_COMPLETION_INDEX={index} is not below DMLC_NUM_WORKER={size}")
    if not env.get("DMLC_PS_ROOT_URI", "").strip():
        raise ClusterError(f"in {manager}, set DMLC_PS_ROOT_URI to pod 0's name in the job's "
                           "headless Service (<job>-0.<service>), where the scheduler runs")
    # The pod's hostname is <job>-<index>: the job's name, the same in every pod.
    job = env.get("HOSTNAME", "").strip().removesuffix(f"-{index}")
    implied = {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(index),
               "BYTEPS_LOCAL_SIZE": "1", "BYTEPS_LOCAL_RANK": "0"}
    return _with_helpers(manager, env, implied, job or None, is_first=index == 0,
                         is_host_leader=True, colocated_servers=size)


# Volcano's svc plugin lists each task's pods as VC_<TASK>_HOSTS; the worker tasks are
# named one of these, the server tasks one of _VOLCANO_SERVERS.
_VOLCANO_WORKERS = ("VC_WORKER_HOSTS", "VC_CHIEF_HOSTS")
_VOLCANO_SERVERS = ("VC_SERVER_HOSTS", "VC_PS_HOSTS")


def _volcano(env: Mapping[str, str]) -> Placement:
    """A Volcano job: chief and worker task pods are workers (chief first), server or ps
    task pods are servers; a pod finds its task by its hostname (<job>-<task>-<index>,
    the first label of its entry in VC_<TASK>_HOSTS). The first worker runs the
    scheduler; without server tasks every worker pod runs a server."""
    def hosts(names) -> list[str]:
        return [h.strip() for n in names for h in env.get(n, "").split(",") if h.strip()]

    workers = hosts(("VC_CHIEF_HOSTS", "VC_WORKER_HOSTS"))
    servers = hosts(_VOLCANO_SERVERS)
    me = env.get("HOSTNAME", "").strip()
    labels = [host.split(".")[0] for host in workers + servers]
    if not workers:
        raise ClusterError("the Volcano job lists no worker pods (VC_WORKER_HOSTS)")
    if me not in labels:
        raise ClusterError(f"HOSTNAME={me!r} is none of the Volcano job's worker or server "
                           f"pods ({', '.join(labels)})")
    position = labels.index(me)
    implied = {"DMLC_NUM_WORKER": str(len(workers)), "BYTEPS_LOCAL_SIZE": "1",
               "DMLC_PS_ROOT_URI": workers[0]}
    if servers:
        implied["DMLC_NUM_SERVER"] = str(len(servers))
    job_id = workers[0].split(".")[0]
    if position >= len(workers):
        implied["DMLC_ROLE"] = "server"
        return _with_helpers("Volcano", env, implied, job_id, is_first=False,
                             is_host_leader=False, colocated_servers=0)
    implied.update(DMLC_ROLE="worker", DMLC_WORKER_ID=str(position), BYTEPS_LOCAL_RANK="0")
    return _with_helpers("Volcano", env, implied, job_id, is_first=position == 0,
                         is_host_leader=True, colocated_servers=len(workers))


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list, as `scontrol show hostnames` expands it: entries
    split at commas outside brackets; in each, every bracket group (numbers and ranges,
    zero-padded to the width of their first bound) multiplies the names, the first group
    outermost. `node[01-02,07],gpu5,rack[1-2]-ib[3-4]` -> node01 node02 node07 gpu5
    rack1-ib3 rack1-ib4 rack2-ib3 rack2-ib4."""
    def invalid(what: str) -> ClusterError:
        return ClusterError(f"SLURM_NODELIST={nodelist!r}: cannot read {what!r}")

    def numbers(group: str) -> list[str]:
        found = []
        for part in group.split(","):
            first, dash, last = part.partition("-")
            if not first.isdigit() or (dash and not last.isdigit()) or \
                    (dash and int(last) < int(first)):
                raise invalid(part)
            found += [f"{n:0{len(first)}d}" for n in range(int(first), int(last or first) + 1)]
        return found

    def expand(entry: str) -> list[str]:
        names = [""]
        for match in re.finditer(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", entry):
            names = [name + match.group(1) for name in names]
            if match.group(2) is not None:
                group = numbers(match.group(2))
                names = [name + number for name in names for number in group]
        return names

    entries, depth, start = [], 0, 0
    for at, char in enumerate(nodelist.strip() + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise invalid(nodelist)
        if char == "," and depth == 0:
            entries.append(nodelist.strip()[start:at])
            start = at + 1
    if depth:
        raise invalid(nodelist)
    return [host for entry in entries if entry for host in expand(entry)]
