"""Several hosts on this machine: network namespaces joined by a bridge, each host's
link limited by `tc` in both directions, so that jobs meet a real network between
hosts (TCP between them, shared memory only inside one). Needs root; tests skip
without it. Used by the tests and by examples/benchmarks.

    with NetBed(hosts=3, mbit=400) as bed:
        subprocess.run(bed.command(0, ["python", "-c", "..."]))
        bed.address(1)  # "10.77.x.2"
"""

from __future__ import annotations

import os
import shutil
import subprocess


class NetBedUnavailable(RuntimeError):
    """This machine cannot make namespaces (not root, no `ip`)."""


class NetBed:
    def __init__(self, hosts: int, mbit: float | None = None):
        self.hosts = hosts
        self.mbit = mbit
        tag = os.getpid() % 100000
        self._bridge = f"bpsbr{tag}"
        self._namespaces = [f"bps{tag}h{i}" for i in range(hosts)]
        self._subnet = f"10.77.{tag % 250}"
        self._made: list[list[str]] = []  # undo commands, run in reverse

    def address(self, host: int) -> str:
        return f"{self._subnet}.{host + 1}"

    def command(self, host: int, argv: list[str]) -> list[str]:
        """`argv` run on `host` (in its namespace)."""
        return ["ip", "netns", "exec", self._namespaces[host], *argv]

    def __enter__(self) -> NetBed:
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
            raise NetBedUnavailable("network namespaces need root, `ip` and `tc`")
        try:
            self._up()
        except subprocess.CalledProcessError as error:
            self.__exit__(None, None, None)
            raise NetBedUnavailable(f"cannot make the test hosts: {error.stderr}") from error
        return self

    def __exit__(self, *exc) -> None:
        for undo in reversed(self._made):
            subprocess.run(undo, capture_output=True)
        self._made.clear()

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def _limit(self, namespace: str | None, device: str) -> None:
        if self.mbit is None:
            return
        prefix = ["ip", "netns", "exec", namespace] if namespace else []
        # A token bucket: `mbit` sustained, with a burst of a few packets.
        subprocess.run([*prefix, "tc", "qdisc", "add", "dev", device, "root", "tbf", "rate",
                        f"{self.mbit}mbit", "burst", "128kb", "latency", "100ms"],
                       check=True, capture_output=True, text=True)

    def _up(self) -> None:
        self._ip("link", "add", self._bridge, "type", "bridge")
        self._made.append(["ip", "link", "del", self._bridge])
        self._ip("link", "set", self._bridge, "up")
        for host, namespace in enumerate(self._namespaces):
            outside = f"{namespace}b"
            self._ip("netns", "add", namespace)
            self._made.append(["ip", "netns", "del", namespace])
            self._ip("link", "add", f"{namespace}a", "type", "veth", "peer", "name", outside)
            self._ip("link", "set", f"{namespace}a", "netns", namespace)
            self._ip("-n", namespace, "link", "set", f"{namespace}a", "name", "eth0")
            self._ip("-n", namespace, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            self._ip("-n", namespace, "link", "set", "eth0", "up")
            self._ip("-n", namespace, "link", "set", "lo", "up")
            self._ip("link", "set", outside, "master", self._bridge)
            self._ip("link", "set", outside, "up")
            self._limit(namespace, "eth0")  # what the host sends
            self._limit(None, outside)  # what it receives
