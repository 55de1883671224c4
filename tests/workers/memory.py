"""What a process of a job holds in memory, read from /proc (Linux):

- anon: its private memory (RssAnon): tensors, buffers, the interpreter;
- shared: the shared pages it has mapped (RssShmem): its own arenas and the peers'
  it reads, so a page two processes read counts for both;
- owned: the memory behind the shared-memory arenas it created (memfds named
  `tf_bps.<pid>`, as the core names them), counted once, where they were made.

anon + owned, summed over a job's processes, is what the job takes from the machine."""

import json
import os
import queue
import re
import threading
import time


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def owned_shared_bytes(pid: int) -> int:
    """Bytes allocated to the arenas `pid` created, each arena once."""
    own = re.compile(rf"^/memfd:tf_bps\.{pid} \(deleted\)$")
    seen, total = set(), 0
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            if not own.match(os.readlink(f"{fd_dir}/{fd}")):
                continue
            info = os.stat(f"{fd_dir}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if info.st_ino not in seen:
            seen.add(info.st_ino)
            total += info.st_blocks * 512
    return total


def process_memory(pid: int) -> dict[str, int]:
    return {"anon": _status_kib(pid, "RssAnon") * 1024,
            "shared": _status_kib(pid, "RssShmem") * 1024,
            "owned": owned_shared_bytes(pid)}


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), read from /proc."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:  # ended meanwhile
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    kids = [int(child) for child in children.read().split()]
            except OSError:
                continue
            found += kids
            frontier += kids
    return found


def servers_of(pid: int) -> list[int]:
    """The native summation servers (bps_server) a launcher at `pid` started."""
    servers = []
    for child in descendants(pid):
        try:
            with open(f"/proc/{child}/comm") as comm:
                if comm.read().strip() == "bps_server":
                    servers.append(child)
        except OSError:
            continue
    return sorted(servers)


def follow(process, deadline: float):
    """The lines `process` prints, as they come, until its output ends or `deadline`
    (time.monotonic()) passes; a generator, which may be left and taken up again."""
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            return
        yield line


def watch_soak(process, marks: list[int], deadline: float) -> tuple[dict, dict, list[str]]:
    """Follows a `bpslaunch ... soak.py` job's output until it ends or `deadline`
    (time.monotonic()) passes. Returns the workers' reports, by (rank, step), the
    servers' memory when rank 0 reported each step in `marks` and its last report, by
    (server index, step), and the output lines."""
    workers, servers, output = {}, {}, []
    for line in follow(process, deadline):
        output.append(line)
        if "MEMORY " not in line:
            continue
        report = json.loads(line.split("MEMORY ", 1)[1])
        workers[report["rank"], report["step"]] = report
        if report["rank"] == 0 and (report["step"] in marks or report.get("last")):
            for index, server in enumerate(servers_of(process.pid)):
                servers[index, report["step"]] = process_memory(server)
    return workers, servers, output
