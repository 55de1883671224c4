"""Each process's metrics port (BYTEPS_METRICS_PORT): given a port P, the launcher hands
the processes of a machine P, P + 1, ... in the order it starts them there (the
scheduler, the servers, then the workers), so that every endpoint of a host has its own,
known in advance. P = 0 is passed on as it is: each process takes any free port and logs
it."""

from __future__ import annotations

import collections

from tf_bps.launch.hosts import HostError

MAX_PORT = 65535


class MetricsPorts:
    def __init__(self, base: dict[str, str]):
        raw = base.get("BYTEPS_METRICS_PORT", "").strip()
        self._first = int(raw) if raw.isdigit() else None  # config.py checks the rest
        self._taken: collections.Counter[str] = collections.Counter()

    def assign(self, machine: str, env: dict[str, str]) -> None:
        """Gives the next process started on `machine` (a host's name; one name for
        every host that is this machine) its port in `env`."""
        if not self._first:
            return
        port = self._first + self._taken[machine]
        if port > MAX_PORT:
            raise HostError(f"BYTEPS_METRICS_PORT={self._first}: the processes of {machine} "
                            f"need ports up to {port}, past {MAX_PORT}")
        self._taken[machine] += 1
        env["BYTEPS_METRICS_PORT"] = str(port)
