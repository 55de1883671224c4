"""Runs the processes of a job on one machine and ends them as a whole.

bpslaunch uses it for the processes it starts on its own machine (and for the ssh
sessions that carry the other hosts), and each remote host's agent (agent.py) for the
processes of that host. The rules are the same everywhere: workers' output is prefixed
with their rank, the first worker that fails ends the job with its status (in an
elastic job the others go on without it, and the job fails only when no worker
succeeds or the scheduler gives up), and nothing started is left running when `run`
returns.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tf_bps.launch import affinity
from tf_bps.launch.lifeline import dies_with_this_process
from tf_bps.launch.output import JobOutput, folder_for, is_tf_start_up_notice
from tf_bps.runtime.config import Config, ConfigError

# How long servers and the scheduler get to exit by themselves once the workers are done,
# and how long the workers get to report their own error once a server has failed.
EXIT_GRACE_S = 30.0
FAILURE_GRACE_S = 5.0
TERMINATE_GRACE_S = 3.0


class LaunchError(RuntimeError):
    """A process of the job could not be started; everything started is ended."""


@dataclass
class ProcessPlan:
    label: str  # "worker 3", "server 0", "scheduler"
    command: list[str]
    env: dict[str, str]  # set on top of the host's environment
    is_worker: bool
    prefix: str | None = None  # tag for each line of its output
    # Drop TensorFlow's start-up notices from its output (output.py): a worker's, unless
    # --verbose or the user's TF_CPP_MIN_LOG_LEVEL asks for them.
    hide_tf_notices: bool = False


# The module each helper role runs (`python -m ...`).
_HELPER_MODULES = {"scheduler": "tf_bps.control.scheduler", "server": "tf_bps.control.server"}


def helper_plan(role: str, label: str, job: dict[str, str],
                python: str = sys.executable) -> ProcessPlan:
    """A scheduler or server of the job (`role`), with the job's variables `job`."""
    return ProcessPlan(label, [python, "-m", _HELPER_MODULES[role]], {**job, "DMLC_ROLE": role},
                       is_worker=False)


@dataclass
class Child:
    label: str  # "worker 0", "server 1", "scheduler", "host node2"
    process: subprocess.Popen
    is_worker: bool  # The job is done when every worker child has exited.


def exit_status(returncode: int) -> int:
    """A shell's view of a status: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """"status 143 (SIGTERM)" for a process a signal ended, "status 1" otherwise."""
    if returncode >= 0:
        return f"status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"status {exit_status(returncode)} ({name})"


class JobSupervisor:
    """Starts processes, prefixes worker output, and ends the job as a whole."""

    def __init__(self, name: str = "bpslaunch", elastic: bool = False,
                 output: JobOutput | None = None):
        self.name = name  # How its own messages start.
        self.output = output or JobOutput()
        # An elastic job goes on when a worker fails; `worker_exited(child, status)`
        # hears of every worker that exits (elastic_driver.py).
        self.elastic = elastic
        self.worker_exited: Callable[[Child, int], None] | None = None
        self.children: list[Child] = []
        self._exits: queue.Queue[Child | str] = queue.Queue()
        self._pumps: list[threading.Thread] = []

    def start_host(self, processes: list[ProcessPlan], env: dict[str, str]) -> None:
        """Starts this host's share of a job, on top of `env`, with its workers pinned
        to their cores (affinity.py; the workers are in local rank order)."""
        workers = [process for process in processes if process.is_worker]
        cores = None
        if workers:
            try:
                config = Config.from_env({**env, **workers[0].env})
                cores = affinity.plan_cores(config, len(workers),
                                            gpu_nodes=affinity.gpu_numa_nodes(env))
            except ConfigError as error:
                self.terminate()
                raise LaunchError(str(error)) from None
        local_ranks = iter(range(len(workers)))
        for process in processes:
            # Compared by value, a plan could match another worker's: count instead.
            local_rank = next(local_ranks) if process.is_worker else None
            cpus = cores[local_rank] if cores and local_rank is not None else None
            self.start(process.label, process.command, {**env, **process.env},
                       process.is_worker, prefix=process.prefix, cpus=cpus,
                       hide_tf_notices=process.hide_tf_notices)

    def start(self, label: str, command: list[str], env: dict[str, str], is_worker: bool,
              prefix: str | None = None, stdin: bytes | None = None,
              cpus: frozenset[int] | None = None, hide_tf_notices: bool = False) -> Child:
        """`prefix`: tag each line of its output (else it writes to ours directly, unless
        self.output keeps every line); `stdin`: written to its standard input, which then
        stays open (an ssh session's remote side ends its processes when it closes);
        `cpus`: where it may run; `hide_tf_notices`: see ProcessPlan."""
        piped = prefix is not None or self.output.keeps_every_line or hide_tf_notices
        pipe = subprocess.PIPE if piped else None
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        try:
            # Each in a session of its own, ended by its group (terminate); and with
            # this process, if it is killed outright (lifeline.py).
            process = subprocess.Popen(command, env=env, stdout=pipe, stderr=pipe,
                                       stdin=subprocess.PIPE if stdin is not None else None,
                                       start_new_session=True,
                                       preexec_fn=dies_with_this_process(pin))
        except OSError as error:
            self.terminate()
            raise LaunchError(f"cannot start {label} ({command[0]!r}): "
                              f"{error.strerror or error}") from None
        if stdin is not None:
            try:
                process.stdin.write(stdin)
                process.stdin.flush()
            except BrokenPipeError:
                pass  # It exited already; its status says why.
        child = Child(label, process, is_worker)
        self.children.append(child)
        if piped:
            for source, stream in ((process.stdout, "stdout"), (process.stderr, "stderr")):
                pump = threading.Thread(target=self._pump, daemon=True, args=(
                    source, stream, (prefix or "").encode(), folder_for(label),
                    hide_tf_notices))
                pump.start()
                self._pumps.append(pump)
        threading.Thread(target=self._wait, args=(child,), daemon=True).start()
        return child

    def stop(self, reason: str) -> None:
        """Makes `run` end the job now (from any thread), reporting `reason`."""
        self._exits.put(reason)

    def _pump(self, source, stream: str, tag: bytes, origin: str, hide_tf_notices: bool) -> None:
        for line in iter(source.readline, b""):
            if not (hide_tf_notices and is_tf_start_up_notice(line)):
                self.output.write(line, tag, stream, origin)

    def _wait(self, child: Child) -> None:
        child.process.wait()
        self._exits.put(child)

    def terminate(self) -> None:
        """Ends every child still running: SIGTERM to its process group, then SIGKILL."""
        running = [c for c in self.children if c.process.poll() is None]
        for child in running:
            self._signal(child, signal.SIGTERM)
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for child in running:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(child, signal.SIGKILL)
                child.process.wait()

    def end(self, child: Child) -> None:
        """Ends one child (SIGTERM to its group); `run` hears of its exit as usual."""
        self._signal(child, signal.SIGTERM)

    @staticmethod
    def _signal(child: Child, sig: int) -> None:
        try:
            os.killpg(child.process.pid, sig)  # Its own session: the group id is its pid.
        except ProcessLookupError:
            pass

    def run(self) -> int:
        """Waits for the children in the order they exit; returns the job's status.

        With workers among the children, the job is done when they all succeeded and
        the others (servers, scheduler) exited within EXIT_GRACE_S. Without workers (a
        host that only serves), it is done when every child succeeded. In an elastic
        job workers may be added while it runs (start()); a failed one ends the job only
        when no worker succeeded (`worker_exited` hears of each).
        """
        exited: set[int] = set()  # ids of the children that exited

        def left(workers: bool) -> int:
            return sum(c.is_worker == workers and id(c) not in exited for c in self.children)

        only_helpers = left(True) == 0
        failed_helper: tuple[Child, float] | None = None
        helpers_deadline: float | None = None
        worker_failure = 0  # an elastic job's first failed worker's status
        any_succeeded = False
        try:
            while left(True) or left(False):
                deadline = failed_helper[1] if failed_helper else helpers_deadline
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    child = self._exits.get(timeout=timeout)
                except queue.Empty:
                    if failed_helper is None:
                        self.report("servers or scheduler did not exit after the workers "
                                    "finished")
                        return 1
                    helper = failed_helper[0]
                    status = exit_status(helper.process.returncode)
                    self.report(f"{helper.label} exited with "
                                f"{describe_exit(helper.process.returncode)}; ending the job")
                    return status or 1
                if isinstance(child, str):
                    self.report(f"{child}; ending the job")
                    return 1
                exited.add(id(child))
                status = exit_status(child.process.returncode)
                if child.is_worker:
                    if status != 0 and not self.elastic:
                        self.report(f"{child.label} failed with "
                                    f"{describe_exit(child.process.returncode)}; ending the job")
                        return status
                    if self.worker_exited is not None:
                        self.worker_exited(child, status)
                    if status != 0:
                        self.report(f"{child.label} exited with "
                                    f"{describe_exit(child.process.returncode)}; the elastic "
                                    "job goes on without it")
                        worker_failure = worker_failure or status
                    any_succeeded = any_succeeded or status == 0
                    if not left(True):
                        if not any_succeeded:
                            self.report("every worker failed; ending the job")
                            return worker_failure
                        helpers_deadline = time.monotonic() + EXIT_GRACE_S
                    continue
                if status == 0 or helpers_deadline is not None:
                    continue  # The workers are done; their results stand.
                if self.elastic and child.label != "scheduler":
                    # Its scheduler re-forms an elastic job without it, or ends it.
                    self.report(f"{child.label} exited with "
                                f"{describe_exit(child.process.returncode)}; the elastic job "
                                "goes on without it")
                    continue
                if only_helpers:
                    self.report(f"{child.label} exited with "
                                f"{describe_exit(child.process.returncode)}; ending the job")
                    return status
                if failed_helper is None:
                    # The workers will see the failure themselves; let them say why.
                    failed_helper = (child, time.monotonic() + FAILURE_GRACE_S)
            return 0
        finally:
            self.terminate()
            for pump in self._pumps:
                pump.join(timeout=1)
            self.output.close()

    def report(self, message: str) -> None:
        print(f"{self.name}: {message}", file=sys.stderr, flush=True)


def supervise(supervisor: JobSupervisor) -> int:
    """`supervisor.run()`, ending every child if this process is told to stop."""
    def on_signal(signum, frame):
        supervisor.terminate()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return supervisor.run()
