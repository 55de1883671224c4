"""Several hosts on this machine: network namespaces joined by a bridge, each host's
link limited by `tc` in both directions, so that jobs meet a real network between
hosts (TCP between them, shared memory only inside one). Needs root; tests skip
without it. Used by the tests and by examples/benchmarks.

    with NetBed(hosts=3, mbit=400) as bed:
        subprocess.run(bed.command(0, ["python", "-c", "..."]))
        bed.address(1)  # "10.x.y.2"
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time


class NetBedUnavailable(RuntimeError):
    """This machine cannot make namespaces (not root, no `ip`)."""


class NetBed:
    def __init__(self, hosts: int, mbit: float | None = None):
        self.hosts = hosts
        self.mbit = mbit
        tag = os.getpid() % 100000
        self._bridge = f"bpsbr{tag}"
        self._namespaces = [f"bps{tag}h{i}" for i in range(hosts)]
        # Beds of processes with nearby PIDs (pytest -n's workers) never share a subnet.
        self._subnet = f"10.{64 + tag // 250 % 64}.{tag % 250}"
        self._made: list[list[str]] = []  # undo commands, run in reverse

    def address(self, host: int) -> str:
        return f"{self._subnet}.{host + 1}"

    def namespace(self, host: int) -> str:
        return self._namespaces[host]

    def cut(self, host: int) -> None:
        """Takes `host`'s link down, as a pulled cable would: nothing it sends arrives,
        nothing reaches it, and no connection hears that it ended."""
        self._ip("link", "set", f"{self._namespaces[host]}b", "down")

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
            # Deleted explicitly: a namespace a process still holds would keep it.
            self._made.append(["ip", "link", "del", outside])
            self._ip("link", "set", f"{namespace}a", "netns", namespace)
            self._ip("-n", namespace, "link", "set", f"{namespace}a", "name", "eth0")
            self._ip("-n", namespace, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            self._ip("-n", namespace, "link", "set", "eth0", "up")
            self._ip("-n", namespace, "link", "set", "lo", "up")
            self._ip("link", "set", outside, "master", self._bridge)
            self._ip("link", "set", outside, "up")
            self._limit(namespace, "eth0")  # what the host sends
            self._limit(None, outside)  # what it receives


class SshHosts:
    """A real sshd (Debian's openssh-server) in every host of a NetBed, on port `port`,
    reachable as root with a key made for the test. `ssh_options()` are the bpslaunch
    options that reach them; the client's host-key checks are off, as the keys are new.

        with NetBed(hosts=3) as bed, SshHosts(bed, workdir) as ssh:
            bpslaunch -H ... *ssh.ssh_options() python train.py
    """

    def __init__(self, bed: NetBed, workdir: str, port: int = 2222):
        self.bed, self.workdir, self.port = bed, workdir, port
        self.key = os.path.join(workdir, "id_ed25519")
        self._daemons: list[subprocess.Popen] = []

    def ssh_options(self, short: bool = False) -> list[str]:
        """`short`: horovodrun's -p and -i instead of the long names."""
        port, key = ("-p", "-i") if short else ("--ssh-port", "--ssh-identity-file")
        return [port, str(self.port), key, self.key,
                "--ssh-command", f"ssh -F {os.path.join(self.workdir, 'ssh_config')}"]

    def __enter__(self) -> SshHosts:
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        if not os.path.exists(sshd) or not shutil.which("ssh-keygen"):
            raise NetBedUnavailable("sshd is not installed (apt-get install openssh-server)")
        host_key = os.path.join(self.workdir, "host_key")
        for path in (self.key, host_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path],
                           check=True, capture_output=True)
        shutil.copy(f"{self.key}.pub", os.path.join(self.workdir, "authorized_keys"))
        with open(os.path.join(self.workdir, "sshd_config"), "w") as config:
            config.write(f"HostKey {host_key}\nAuthorizedKeysFile {self.workdir}/authorized_keys"
                         "\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                         "StrictModes no\nUsePAM no\nPidFile none\nMaxStartups 100\n")
        with open(os.path.join(self.workdir, "ssh_config"), "w") as config:
            config.write("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                         "  LogLevel ERROR\n")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        for host in range(self.bed.hosts):
            self._daemons.append(subprocess.Popen(
                self.bed.command(host, [sshd, "-D", "-e", "-p", str(self.port), "-f",
                                        os.path.join(self.workdir, "sshd_config")]),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait_until_listening()
        return self

    def _wait_until_listening(self) -> None:
        deadline = time.monotonic() + 20
        for host in range(self.bed.hosts):
            probe = self.bed.command(host, ["ssh", "-F", os.path.join(self.workdir, "ssh_config"),
                                            "-p", str(self.port), "-i", self.key, "-o",
                                            "BatchMode=yes", self.bed.address(host), "true"])
            while subprocess.run(probe, capture_output=True).returncode != 0:
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise NetBedUnavailable(f"sshd on host {host} does not answer")
                time.sleep(0.2)

    def daemon_pids(self) -> set[int]:
        return {daemon.pid for daemon in self._daemons}

    def __exit__(self, *exc) -> None:
        for daemon in self._daemons:
            daemon.kill()
            daemon.wait()
        self._daemons.clear()
