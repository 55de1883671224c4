"""bpslaunch's elastic side (--host-discovery-script): keeps a job's workers on the
hosts a discovery script lists, as horovodrun's elastic driver does.

The scheduler and the servers run on the launcher's machine and stay up for the
whole job; workers come and go. Every second the driver runs the discovery script:
on a host that appeared (or came back from the blacklist) it starts workers while
the job has fewer than --max-np, and the workers already training take them in at
their next commit; the workers of a host that disappeared are let go at their next
commit (the driver asks the scheduler, and every worker stops there), so the others
re-form without a restore or a sync, and are ended if they are still there
LET_GO_GRACE_S later. A worker that fails puts its host on the blacklist (for good,
or for a time drawn from --blacklist-cooldown-range) and its host's other workers
are ended too. The scheduler ends the job when fewer than --min-np workers are left
for --elastic-timeout seconds, or past --reset-limit re-formings; the launcher ends
it when every worker failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from tf_bps.launch import remote
from tf_bps.launch.discovery import Blacklist, DiscoveryError, discover_hosts
from tf_bps.launch.hosts import Host
from tf_bps.launch.supervisor import Child, JobSupervisor, ProcessPlan
from tf_bps.runtime.config import Config, ConfigError
from tf_bps.runtime.rendezvous import RendezvousError, SchedulerLink

DISCOVERY_INTERVAL_S = 1.0
# How long the workers of a host that left get to reach their next commit.
LET_GO_GRACE_S = 30.0


@dataclass
class ElasticSettings:
    script: str  # --host-discovery-script
    default_slots: int  # --slots-per-host
    initial: int  # -np (default --min-np): workers to start with, at least
    min_np: int
    max_np: int | None
    timeout: float  # --elastic-timeout
    cooldown: tuple[float, float] | None  # --blacklist-cooldown-range


@dataclass
class _Worker:
    host: str
    child: Child
    name: str  # BYTEPS_ELASTIC_WORKER_NAME
    ending: bool = False  # ended by the driver: its exit is no failure
    end_at: float | None = None  # let go: ended then if still running


class ElasticDriver:
    """Starts and ends an elastic job's workers as its hosts come and go.
    `worker_plan(host, index, local)` is the process of the job's `index`-th worker
    started, on `host` (`local`: this machine)."""

    def __init__(self, supervisor: JobSupervisor, settings: ElasticSettings,
                 worker_plan: Callable[[str, int, bool], ProcessPlan],
                 ssh: remote.SshOptions, base_env: dict[str, str], job_env: dict[str, str]):
        self._supervisor = supervisor
        self._settings = settings
        self._worker_plan = worker_plan
        self._ssh = ssh
        self._env = base_env
        self._job_env = job_env  # the job's variables, complete once it started
        self._scheduler: SchedulerLink | None = None  # opened at the first need
        self._scheduler_lock = threading.Lock()  # the poll thread and worker exits use it
        self._blacklist = Blacklist(settings.cooldown)
        self._lock = threading.Lock()
        self._workers: dict[int, _Worker] = {}  # by id() of the child
        self._started = 0
        self._finished = False  # a worker succeeded: the training is over
        self._stop = threading.Event()
        self._last_problem = ""
        supervisor.worker_exited = self._on_worker_exit

    def first_hosts(self) -> list[Host]:
        """Waits until the script lists slots for -np workers (--elastic-timeout)."""
        settings = self._settings
        deadline = time.monotonic() + settings.timeout
        while True:
            hosts = self._discover()
            slots = sum(host.slots for host in hosts or [])
            if slots >= settings.initial:
                return hosts
            if time.monotonic() >= deadline:
                raise DiscoveryError(
                    f"the host discovery script lists {slots} slot(s), fewer than the "
                    f"{settings.initial} worker(s) to start with (-np/--min-np), and no more "
                    f"came within --elastic-timeout={settings.timeout:g} s")
            time.sleep(DISCOVERY_INTERVAL_S)

    def start_workers(self, hosts: list[Host], joining: bool = False) -> None:
        """Fills the free slots of `hosts`, in order, while the job has fewer than
        --max-np workers. `joining`: the job runs already, and the scheduler hears
        whom to expect, so that workers started together join at one commit."""
        most = self._settings.max_np
        started = []
        with self._lock:
            running = self._running_by_host()
            count = sum(running.values())
            for host in hosts:
                for _ in range(host.slots - running.get(host.name, 0)):
                    if most is not None and count >= most:
                        break
                    started.append(self._start(host.name))
                    count += 1
        if joining and started:
            self._tell_scheduler({"type": "launching", "names": started})

    def run(self) -> None:
        """Polls the discovery script until stop(); from a thread of its own."""
        while not self._stop.wait(DISCOVERY_INTERVAL_S):
            hosts = self._discover()
            if hosts is None or self._finished:
                continue
            available = [host for host in hosts if not self._blacklist.blocks(host.name)]
            names = {host.name for host in available}
            with self._lock:
                gone = {w.host for w in self._workers.values() if w.host not in names}
            for host in sorted(gone):
                self._let_go(host)
            self._end_overdue()
            self.start_workers(available, joining=True)

    def stop(self) -> None:
        self._stop.set()
        with self._scheduler_lock:
            if self._scheduler is not None:
                self._scheduler.close(say_done=False)
                self._scheduler = None

    # -- helpers ---------------------------------------------------------------------

    def _discover(self) -> list[Host] | None:
        """The script's hosts; None (said once per distinct problem) when it failed."""
        try:
            hosts = discover_hosts(self._settings.script, self._settings.default_slots)
        except DiscoveryError as error:
            if str(error) != self._last_problem:
                self._supervisor.report(f"{error}; keeping the hosts as they were")
                self._last_problem = str(error)
            return None
        self._last_problem = ""
        return hosts

    def _running_by_host(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for worker in self._workers.values():
            if not worker.ending and worker.child.process.poll() is None:
                counts[worker.host] = counts.get(worker.host, 0) + 1
        return counts

    def _start(self, host: str) -> str:
        """Starts the next worker on `host` (needs the lock); returns its name."""
        local = remote.is_this_machine(host)
        plan = self._worker_plan(host, self._started, local)
        self._started += 1
        if local:
            child = self._supervisor.start(plan.label, plan.command, {**self._env, **plan.env},
                                           is_worker=True, prefix=plan.prefix)
        else:
            plan.env = {**remote.forwarded_environment(self._env), **plan.env}
            child = self._supervisor.start(plan.label, remote.agent_command(host, self._ssh),
                                           self._env, is_worker=True,
                                           stdin=remote.encode_plan([plan]))
        name = plan.env.get("BYTEPS_ELASTIC_WORKER_NAME", "")
        self._workers[id(child)] = _Worker(host, child, name)
        return name

    def _tell_scheduler(self, message: dict) -> bool:
        """Sends `message` over the launcher's own connection to the scheduler (made at
        the first need); False, said once, if the scheduler cannot be reached."""
        try:
            with self._scheduler_lock:
                if self._scheduler is None:
                    config = Config.from_env({**self._env, **self._job_env})
                    self._scheduler = SchedulerLink(config)
                    self._scheduler.register("launcher")
                self._scheduler.send(message)
            return True
        except (RendezvousError, ConfigError, zmq.ZMQError) as error:
            self._supervisor.report(f"cannot reach the scheduler ({error})")
            return False

    def _let_go(self, host: str) -> None:
        """Asks the scheduler to let `host`'s workers go at their next commit; they are
        ended LET_GO_GRACE_S later if still running (or now, if it cannot be asked)."""
        with self._lock:
            leaving = [w for w in self._workers.values() if w.host == host and not w.ending]
            for worker in leaving:
                worker.ending = True
                worker.end_at = time.monotonic() + LET_GO_GRACE_S
        if not leaving:
            return
        self._supervisor.report(f"host {host} is no longer listed by the host discovery "
                                f"script: its {len(leaving)} worker(s) leave at their next "
                                "commit")
        if not self._tell_scheduler({"type": "let_go", "names": [w.name for w in leaving]}):
            self._supervisor.report("ending them, as the scheduler cannot let them go")
            for worker in leaving:
                self._supervisor.end(worker.child)

    def _end_overdue(self) -> None:
        now = time.monotonic()
        with self._lock:
            overdue = [w for w in self._workers.values() if w.end_at is not None and
                       w.end_at <= now and w.child.process.poll() is None]
        for worker in overdue:
            worker.end_at = None
            self._supervisor.report(f"{worker.child.label} did not leave within "
                                    f"{LET_GO_GRACE_S:g} s; ending it")
            self._supervisor.end(worker.child)

    def _end_host(self, host: str, why: str) -> None:
        with self._lock:
            ending = [w for w in self._workers.values() if w.host == host and not w.ending]
            for worker in ending:
                worker.ending = True
        if ending:
            self._supervisor.report(f"host {host} {why}: ending its {len(ending)} worker(s)")
        for worker in ending:
            self._supervisor.end(worker.child)

    def _on_worker_exit(self, child: Child, status: int) -> None:
        with self._lock:
            worker = self._workers.pop(id(child), None)
        if worker is None:
            return
        if self._scheduler is not None and not self._stop.is_set():
            # If it never registered, the others it was started with need not wait.
            self._tell_scheduler({"type": "launch_ended", "names": [worker.name]})
        if worker.ending:
            return
        if status == 0:
            self._finished = True
            return
        seconds = self._blacklist.add(worker.host)
        self._supervisor.report(f"host {worker.host} is blacklisted " +
                                ("for good" if seconds is None else f"for {seconds:.0f} s") +
                                f": {child.label} failed with status {status}")
        self._end_host(worker.host, "is blacklisted")
