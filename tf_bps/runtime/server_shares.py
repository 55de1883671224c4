"""How a job's push_pull traffic is divided among its servers, from where they run.

Servers on separate hosts, or one on each worker host, all get the same share. The
BytePS paper's hybrid layout (OSDI'20, section 3.1) has both: a server on each of the
n worker hosts plus k hosts that run servers only. A worker host's own server takes
part of its traffic off the network, but that server's results leave the host n-1
times; a server-only host carries only the servers' traffic. Equal link rates give
every host the same time when each worker host's servers take a share of

    x = (n - k) / (n^2 + kn - 2k)    and each server-only host's    y = 2(n - 1) / (n^2 + kn - 2k)

(n x + k y = 1), for a time of 2n(n-1)M / ((n^2 + kn - 2k) B) per M bytes at B bytes/s,
below both an even split and the colocated servers alone. With k >= n the worker hosts'
servers get nothing (x = 0): the server-only hosts are enough.
"""

from __future__ import annotations

import math
from collections import Counter

# The largest share the core takes (ParseShares in custom_ops/worker/c_api.cc): a cycle
# of the servers holds each server as many times as its share.
MAX_SHARE = 1000


def server_shares(server_hosts: list[str], worker_hosts: list[str]) -> list[int]:
    """Each server's share of the partitions (integers, in the servers' order), or []
    for the same share each. Uneven only in the hybrid layout: a server on every worker
    host (two or more of them) and at least one host with servers only."""
    workers = set(worker_hosts)
    on_host = Counter(server_hosts)
    server_only = [host for host in on_host if host not in workers]
    n, k = len(workers), len(server_only)
    if n < 2 or not server_only or not workers <= on_host.keys():
        return []
    host_share = {host: 2 * (n - 1) if host in server_only else max(0, n - k)
                  for host in on_host}
    # A host's share is split evenly among its servers; scale so that all are integers.
    scale = math.lcm(*on_host.values())
    shares = [host_share[host] * scale // on_host[host] for host in server_hosts]
    divisor = math.gcd(*shares)
    shares = [share // divisor for share in shares]
    # Odd server counts per host could need a long cycle; an even split is then the
    # fallback (correct, only not the optimum).
    return shares if max(shares) <= MAX_SHARE else []
