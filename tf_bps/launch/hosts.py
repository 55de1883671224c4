"""Where the processes of a job run: host lists (-H, --hostfile) and the job's layout.

The layout follows BytePS: every worker host runs the same number of workers
(DMLC_NUM_WORKER hosts of BYTEPS_LOCAL_SIZE workers each, rank = host index x local
size + local rank), the scheduler runs on the first host, and servers run either on
the worker hosts (colocated) or on hosts of their own (--server-hosts, the CPU-only
server machines of the BytePS paper).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HOST_NAME = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+$")


class HostError(ValueError):
    """A host list or layout that cannot describe a job; the message says which part."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: int  # Processes of the kind the list is for (workers, or servers).


def parse_hosts(spec: str, option: str = "-H") -> list[Host]:
    """`host1:4,host2:4` (a host without `:N` has one slot), as horovodrun reads -H."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise HostError(f"{option} {spec!r}: an empty host name")
        name, sep, slots = item.rpartition(":")
        if not sep or not slots.isdigit():  # "host" alone, or an IPv6-looking name
            name, slots = item, "1"
        hosts.append(_host(name, slots, f"{option} {spec!r}"))
    return _no_repeats(hosts, option)


def read_hostfile(path: str) -> list[Host]:
    """One host per line: `host slots=N` (Open MPI's and horovodrun's form) or
    `host:N` or `host`; `#` starts a comment."""
    try:
        with open(path) as lines:
            text = lines.read(1 << 20)
    except OSError as error:
        raise HostError(f"--hostfile {path!r}: {error.strerror}") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"--hostfile {path!r} line {number}"
        match = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\S+)", line)
        if match:
            hosts.append(_host(match.group(1), match.group(2), where))
        elif " " not in line:
            hosts.extend(parse_hosts(line, where))
        else:
            raise HostError(f"{where}: {line!r} is not `host slots=N`, `host:N` or `host`")
    if not hosts:
        raise HostError(f"--hostfile {path!r} names no host")
    return _no_repeats(hosts, "--hostfile")


def _host(name: str, slots: str, where: str) -> Host:
    if not _HOST_NAME.match(name):
        raise HostError(f"{where}: {name!r} is not a host name or address")
    if not slots.isdigit() or not 1 <= int(slots) <= 4096:
        raise HostError(f"{where}: the slots of {name!r} must be a number from 1 to 4096, "
                        f"not {slots!r}")
    return Host(name, int(slots))


def _no_repeats(hosts: list[Host], option: str) -> list[Host]:
    names = [host.name for host in hosts]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise HostError(f"{option}: {', '.join(repeated)} listed more than once")
    return hosts


@dataclass
class HostRoles:
    """What one host runs."""

    name: str
    scheduler: bool = False
    servers: int = 0
    worker_id: int | None = None  # DMLC_WORKER_ID of its workers; None: no workers
    workers: int = 0  # BYTEPS_LOCAL_SIZE when it has any

    @property
    def has_workers(self) -> bool:
        return self.workers > 0


@dataclass
class Layout:
    hosts: list[HostRoles] = field(default_factory=list)  # the scheduler's host first
    num_worker_hosts: int = 0
    local_size: int = 0  # workers per worker host
    num_servers: int = 0

    @property
    def num_workers(self) -> int:
        return self.num_worker_hosts * self.local_size


def plan_layout(hosts: list[Host], num_workers: int | None = None,
                num_servers: int | None = None,
                server_hosts: list[Host] | None = None) -> Layout:
    """Workers fill the hosts in order (-np of them, default every slot); servers go to
    `server_hosts` (their slots each, or --num-servers dealt in turn) or else are dealt
    in turn over the worker hosts (default one per worker host)."""
    capacity = sum(host.slots for host in hosts)
    if num_workers is None:
        num_workers = capacity
    if not 1 <= num_workers <= capacity:
        raise HostError(f"-np {num_workers}: the hosts have {capacity} slot(s) for workers")
    counts, left = [], num_workers
    for host in hosts:
        counts.append(min(host.slots, left))
        left -= counts[-1]
    used = [(host, count) for host, count in zip(hosts, counts, strict=True) if count]
    if len({count for _, count in used}) > 1:
        detail = ", ".join(f"{host.name}:{count}" for host, count in used)
        raise HostError(
            f"every host must run the same number of workers (DMLC_NUM_WORKER hosts of "
            f"BYTEPS_LOCAL_SIZE workers each), but -np {num_workers} gives {detail}")
    layout = Layout(num_worker_hosts=len(used), local_size=used[0][1])
    roles = {}
    for worker_id, (host, count) in enumerate(used):
        roles[host.name] = HostRoles(host.name, worker_id=worker_id, workers=count)
    if server_hosts:
        holders = [roles.setdefault(host.name, HostRoles(host.name)) for host in server_hosts]
        if num_servers is None:
            for holder, host in zip(holders, server_hosts, strict=True):
                holder.servers = host.slots
        else:
            _deal(holders, num_servers)
    else:
        _deal(list(roles.values()), len(used) if num_servers is None else num_servers)
    layout.num_servers = sum(holder.servers for holder in roles.values())
    if layout.num_servers < 1:
        raise HostError("--num-servers must be at least 1")
    first = hosts[0].name
    roles.setdefault(first, HostRoles(first)).scheduler = True
    layout.hosts = [roles[first], *(r for name, r in roles.items() if name != first)]
    return layout


def _deal(holders: list[HostRoles], count: int) -> None:
    for index in range(count):
        holders[index % len(holders)].servers += 1
