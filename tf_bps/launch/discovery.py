"""The hosts of an elastic job: what its discovery script lists, less the hosts whose
workers failed (the blacklist), as horovodrun's --host-discovery-script has it.

The script prints one host a line, `host:slots` or `host` (then --slots-per-host
slots); the launcher runs it every second.
"""

from __future__ import annotations

import random
import subprocess
import time

from tf_bps.launch.hosts import Host, HostError, parse_hosts

# A script that has not answered in this long is taken as failed, this time.
DISCOVERY_TIMEOUT_S = 30.0
# What is read of its output, at most.
MAX_OUTPUT_BYTES = 1 << 20


class DiscoveryError(RuntimeError):
    """The discovery script failed or printed something that is not a host list."""


def discover_hosts(script: str, default_slots: int) -> list[Host]:
    """Runs `script` (a shell command) once; the hosts it prints."""
    try:
        done = subprocess.run(script, shell=True, capture_output=True,
                              timeout=DISCOVERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"the host discovery script {script!r} did not finish within "
                             f"{DISCOVERY_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        detail = done.stderr[-500:].decode(errors="replace").strip()
        raise DiscoveryError(f"the host discovery script {script!r} exited with status "
                             f"{done.returncode}" + (f": {detail}" if detail else ""))
    hosts = []
    for line in done.stdout[:MAX_OUTPUT_BYTES].decode(errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        if ":" not in line:
            line = f"{line}:{default_slots}"
        try:
            hosts.extend(parse_hosts(line, "the host discovery script's line"))
        except HostError as error:
            raise DiscoveryError(str(error)) from None
    names = [host.name for host in hosts]
    if len(set(names)) != len(names):
        raise DiscoveryError(f"the host discovery script {script!r} lists a host twice: "
                             f"{', '.join(names)}")
    return hosts


class Blacklist:
    """Hosts whose worker failed. Without a cooldown range a host stays out for good;
    with (low, high) it comes back after a time drawn from that range, in seconds,
    as Horovod's --blacklist-cooldown-range has it."""

    def __init__(self, cooldown: tuple[float, float] | None = None, clock=time.monotonic):
        if cooldown is not None and not 0 <= cooldown[0] <= cooldown[1]:
            raise ValueError(f"--blacklist-cooldown-range {cooldown[0]:g} {cooldown[1]:g}: "
                             "expected two numbers of seconds, the first no larger")
        self._cooldown = cooldown
        self._clock = clock
        self._until: dict[str, float] = {}  # host -> when it may come back

    def add(self, host: str) -> float | None:
        """Blacklists `host`; the seconds until it may come back (None: never)."""
        if self._cooldown is None:
            self._until[host] = float("inf")
            return None
        seconds = random.uniform(*self._cooldown)
        self._until[host] = self._clock() + seconds
        return seconds

    def blocks(self, host: str) -> bool:
        until = self._until.get(host)
        if until is not None and self._clock() >= until:
            del self._until[host]
            return False
        return until is not None
