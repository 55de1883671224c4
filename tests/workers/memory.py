"""What a process of a job holds in memory, read from /proc (Linux):

- anon: its private memory (RssAnon): tensors, buffers, the interpreter;
- shared: the shared pages it has mapped (RssShmem): its own arenas and the peers'
  it reads, so a page two processes read counts for both;
- owned: the memory behind the shared-memory arenas it created (memfds named
  `tf_bps.<pid>`, as the core names them), counted once, where they were made.

anon + owned, summed over a job's processes, is what the job takes from the machine."""

import os
import re


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
