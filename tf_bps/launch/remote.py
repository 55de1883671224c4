"""Reaching other hosts: which host names are this machine, the ssh command that runs a
host's agent (agent.py), and what the launcher sends it.

One ssh session per host carries that host's whole share of the job. The launcher
writes the host's plan as one JSON line to the session's standard input and keeps it
open; the agent starts the processes and ends them all when that input closes, which
happens when the launcher ends the job, dies, or loses the host. So a job never leaves
processes behind on a host, whatever happened to the launcher.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
from dataclasses import asdict, dataclass

from tf_bps.launch.supervisor import ProcessPlan
from tf_bps.runtime.config import is_local_address

# The largest plan an agent reads (a plan is a few kB per process).
MAX_PLAN_BYTES = 16 << 20

# Variables that describe the launcher's own session rather than the job: the remote
# host's login sets its own.
_SESSION_VARIABLES = {"HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "SHLVL", "HOSTNAME",
                      "TERM", "DISPLAY", "MAIL", "_", "TMPDIR", "LS_COLORS"}
_SESSION_PREFIXES = ("SSH_", "XDG_", "BASH_FUNC_")


@dataclass
class SshOptions:
    command: str = "ssh"  # --ssh-command: the client, with any options of the user's
    port: int | None = None
    identity_file: str | None = None

    def argv(self, host: str, remote_command: str) -> list[str]:
        # BatchMode: never stop to ask for a password; ConnectTimeout: an unreachable
        # host fails the launch instead of hanging it.
        argv = [*shlex.split(self.command), "-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.identity_file:
            argv += ["-i", self.identity_file]
        return [*argv, host, remote_command]


def is_this_machine(host: str) -> bool:
    """Whether `host` names this machine (its processes then start without ssh)."""
    if host == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET)
    except OSError as error:
        raise ValueError(f"cannot resolve host {host!r}: {error}") from None
    return any(is_local_address(info[4][0]) for info in infos)


def forwarded_environment(env: dict[str, str]) -> dict[str, str]:
    """What the processes on other hosts inherit from the launcher's environment:
    everything but the variables of the launcher's own login session."""
    return {name: value for name, value in env.items()
            if name not in _SESSION_VARIABLES and not name.startswith(_SESSION_PREFIXES)}


def agent_command(host: str, ssh: SshOptions) -> list[str]:
    """The ssh command that starts `host`'s agent in this directory, with this Python
    (the hosts of a job share the installation, as with horovodrun and mpirun)."""
    remote = (f"cd {shlex.quote(os.getcwd())} && exec {shlex.quote(sys.executable)} "
              f"-m tf_bps.launch.agent {shlex.quote(host)}")
    return ssh.argv(host, remote)


def encode_plan(processes: list[ProcessPlan]) -> bytes:
    return json.dumps([asdict(process) for process in processes]).encode() + b"\n"


def decode_plan(line: bytes) -> list[ProcessPlan]:
    """The plan the launcher sent; ValueError if it is not one."""
    items = json.loads(line)
    if not isinstance(items, list):
        raise ValueError("the plan is not a list of processes")
    plans = []
    for item in items:
        plan = ProcessPlan(**item)  # TypeError on unknown or missing fields
        if not (isinstance(plan.command, list) and plan.command
                and all(isinstance(arg, str) for arg in plan.command)
                and isinstance(plan.env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in plan.env.items())):
            raise ValueError(f"the plan of {plan.label!r} is malformed")
        plans.append(plan)
    return plans
