"""The driver's side of a Spark job: the scheduler, and a small service the barrier tasks
talk to (task.py).

Each barrier stage attempt asks the service for a job of its own (its lowest partition
does, and shares the answer with the others through `allGather`): the driver then ends
the scheduler of any earlier attempt and starts a new one, on a new port with a new
token, so the tasks of an attempt Spark gave up on can never meet those of the next.
Every task also opens a connection for its events: it started its rank, a line of
output (when `stdout`/`stderr` ask for them here), its rank failed. A failed rank ends
the whole Spark job unless every task finishes within FAILURE_GRACE_S, and a job whose
ranks have not all started within the start timeout is cancelled too; `cancel_reason`
then says why.

Requests carry a secret that only the tasks' closures hold (Spark ships them to the
executors as it ships the function itself).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from tf_bps.runtime.config import is_local_address

# How long the other ranks get to end by themselves once one rank failed (tf_bps stops
# the job everywhere on its own; this catches a rank that is not talking to it).
FAILURE_GRACE_S = 10.0
TERMINATE_GRACE_S = 3.0
MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class TaskPlan:
    """What every barrier task gets in its closure."""

    driver: tuple[str, int]  # the service's address
    secret: str
    payload: bytes  # cloudpickled (fn, args, kwargs)
    env: dict[str, str]  # the user's `env`
    forward_stdout: bool
    forward_stderr: bool
    # Drop TensorFlow's start-up notices from forwarded lines, as bpslaunch does.
    hide_tf_notices: bool = False


@dataclass
class _Job:
    """One attempt's job: its scheduler and what its tasks have said."""

    number: int
    variables: dict[str, str]
    scheduler: subprocess.Popen | None
    started: set[int] = field(default_factory=set)
    failures: list[tuple[float, int, str]] = field(default_factory=list)


class JobDriver:
    """Starts a scheduler per attempt and hears the tasks; `close()` ends everything."""

    def __init__(self, host: str, env: dict[str, str], start_timeout: float, verbose: int,
                 stdout: TextIO | None, stderr: TextIO | None, timestamps: bool):
        self.host = host
        self.secret = secrets.token_hex(16)
        self.cancel_reason: str | None = None
        self.cancel_spark: Callable[[], None] = lambda: None
        self._env, self._start_timeout, self._verbose = env, start_timeout, verbose
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._timestamps = timestamps
        self._lock = threading.Condition()
        self._job: _Job | None = None
        self._closed = False
        # An elastic job goes on when a rank fails; a static one ends (FAILURE_GRACE_S).
        self.failure_ends_job = True
        self._helpers: list[subprocess.Popen] = []  # an elastic job's server
        self._timers: list[threading.Timer] = []
        self._pumps: list[threading.Thread] = []
        self._service = _Service(("" if not is_local_address(host) else host, 0), self)
        self.address = (host, self._service.server_address[1])
        threading.Thread(target=self._service.serve_forever, name="tf_bps-spark-service",
                         daemon=True).start()

    def say(self, message: str) -> None:
        """A message of the driver's own (verbose >= 1)."""
        if self._verbose >= 1:
            print(f"tf_bps.spark: {message}", file=self._streams["stderr"] or sys.stderr,
                  flush=True)

    def new_job(self, num_proc: int, machines: int, workers: int, note: str) -> dict:
        """A new attempt asks for its job: a new scheduler (when it needs one), port and
        token; any earlier attempt's scheduler is ended first."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the run is over")
            number = self._job.number + 1 if self._job else 0
            self._end_scheduler()
            variables = {"BYTEPS_JOB_TOKEN": secrets.token_hex(16),
                         "HOROVOD_START_TIMEOUT": f"{self._start_timeout:g}"}
            scheduler = None
            if num_proc > 1:
                variables.update(DMLC_PS_ROOT_URI=self.host, DMLC_PS_ROOT_PORT=str(_free_port()))
                scheduler = self._start_scheduler(variables, workers, machines)
            self._job = _Job(number, variables, scheduler)
            self._lock.notify_all()
        self.say(f"attempt {number}: {num_proc} process(es) on {machines} machine(s)"
                 + (f"; {note}, so each process is a host of its own" if note else ""))
        return {"job": number, "variables": variables}

    def _start_scheduler(self, variables: dict[str, str], workers: int,
                         machines: int) -> subprocess.Popen:
        env = {**os.environ, **self._env, **variables, "DMLC_ROLE": "scheduler",
               "DMLC_NUM_WORKER": str(workers), "DMLC_NUM_SERVER": str(machines)}
        process = subprocess.Popen([sys.executable, "-m", "tf_bps.control.scheduler"], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        pump = threading.Thread(target=self._pump_scheduler, args=(process,), daemon=True)
        pump.start()
        self._pumps.append(pump)
        return process

    def _pump_scheduler(self, process: subprocess.Popen) -> None:
        for line in iter(process.stdout.readline, b""):
            self.write("scheduler", "stderr", line.decode(errors="replace"), always=True)

    def write(self, origin: object, stream: str, line: str, always: bool = False) -> None:
        """A line of a task (or the scheduler), to `stdout`/`stderr` as Horovod does:
        `[rank]<stdout>:line`, after the time when asked."""
        target = self._streams[stream] or (sys.stderr if always else None)
        if target is None:
            return
        prefix = f"[{origin}]<{stream}>:"
        if self._timestamps:
            prefix = time.strftime("%a %b %d %H:%M:%S %Y ") + prefix
        with self._lock:
            target.write(prefix + line.rstrip("\n") + "\n")
            target.flush()

    def task_event(self, job: int, rank: int, event: dict) -> None:
        with self._lock:
            if self._job is None or job != self._job.number:
                return  # An earlier attempt's task: its job is gone.
            kind = event.get("event")
            if kind == "started":
                self._job.started.add(rank)
                self._lock.notify_all()
            elif kind == "failed":
                self._job.failures.append((time.time(), rank, str(event.get("message"))))
                if len(self._job.failures) == 1 and self.failure_ends_job:
                    self._arm(FAILURE_GRACE_S, self._first_failure_reason)
        if kind == "output":
            self.write(rank, "stderr" if event.get("stream") == "stderr" else "stdout",
                       str(event.get("line", "")))

    def _first_failure_reason(self) -> str | None:
        with self._lock:
            if not self._job or not self._job.failures:
                return None
            _, rank, message = min(self._job.failures)
        return f"rank {rank} failed: {message}"

    def start_elastic_job(self, num_proc: int, elastic: dict[str, str]) -> dict[str, str]:
        """An elastic job's scheduler and one server, in the driver for the whole run (as
        bpslaunch's discovery mode runs them on the launching machine): ranks come and
        go with Spark's tasks, the job stays."""
        from tf_bps.runtime.core import server_executable

        with self._lock:
            variables = {"BYTEPS_JOB_TOKEN": secrets.token_hex(16),
                         "HOROVOD_START_TIMEOUT": f"{self._start_timeout:g}",
                         "DMLC_PS_ROOT_URI": self.host, "DMLC_PS_ROOT_PORT": str(_free_port()),
                         **elastic}
            scheduler = self._start_scheduler(variables, num_proc, 1)
            self._job = _Job(0, variables, scheduler)
            env = {**os.environ, **self._env, **variables, "DMLC_ROLE": "server",
                   "DMLC_NUM_WORKER": str(num_proc), "DMLC_NUM_SERVER": "1"}
            self._helpers.append(subprocess.Popen(
                [str(server_executable())], env=env, stdin=subprocess.DEVNULL,
                start_new_session=True))
        self.failure_ends_job = False
        self.say(f"elastic job: {num_proc} process(es), the scheduler and a server here")
        return variables

    def watch_start(self, num_proc: int, needed: int | None = None) -> None:
        """Cancels the Spark job unless `needed` ranks (default all) of an attempt start
        in time."""
        needed = num_proc if needed is None else needed

        def reason() -> str | None:
            with self._lock:
                started = len(self._job.started) if self._job else 0
                if started >= needed:
                    return None
            return (f"timed out after {self._start_timeout:g} s waiting for the Spark tasks to "
                    f"start ({started} of {num_proc} started): each process runs in a Spark "
                    "task, and a barrier stage needs num_proc free task slots at once; "
                    "raise start_timeout (or HOROVOD_SPARK_START_TIMEOUT) if executors "
                    "are allocated on demand")
        self._arm(self._start_timeout, reason)

    def _arm(self, delay: float, reason: Callable[[], str | None]) -> None:
        def fire():
            found = reason()
            if found:
                self.cancel(found)
        timer = threading.Timer(delay, fire)
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def cancel(self, reason: str) -> None:
        """Ends the Spark job (its tasks' processes end with them), saying why."""
        with self._lock:
            if self.cancel_reason is not None or self._closed:
                return
            self.cancel_reason = reason
        self.say(f"{reason}; cancelling the Spark job")
        self.cancel_spark()

    def failures(self) -> list[tuple[float, int, str]]:
        with self._lock:
            return sorted(self._job.failures) if self._job else []

    def _end_scheduler(self) -> None:
        if self._job and self._job.scheduler:
            _end(self._job.scheduler)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for timer in self._timers:
            timer.cancel()
        self._service.shutdown()
        self._service.server_close()
        self._end_scheduler()
        for helper in self._helpers:
            _end(helper)
        for pump in self._pumps:
            pump.join(timeout=1)


def _end(process: subprocess.Popen) -> None:
    """SIGTERM to its process group, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, None)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class _Service(socketserver.ThreadingTCPServer):
    """One JSON line per request; a task's event connection then sends more lines."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], driver: JobDriver):
        self.driver = driver
        super().__init__(address, _Handler)


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        driver: JobDriver = self.server.driver
        self.request.settimeout(60)  # the first line comes at once
        try:
            request = json.loads(self.rfile.readline(MAX_LINE_BYTES))
            if not hmac.compare_digest(str(request.get("secret", "")), driver.secret):
                return
            if request.get("kind") == "job":
                try:
                    answer = driver.new_job(int(request["num_proc"]), int(request["machines"]),
                                            int(request["workers"]), str(request["note"]))
                except RuntimeError as error:
                    answer = {"error": str(error)}
                self.wfile.write(json.dumps(answer).encode() + b"\n")
            elif request.get("kind") == "task":
                self.request.settimeout(None)  # events come as long as the rank runs
                job, rank = int(request["job"]), int(request["rank"])
                for line in iter(lambda: self.rfile.readline(MAX_LINE_BYTES), b""):
                    driver.task_event(job, rank, json.loads(line))
        except (OSError, ValueError, KeyError, TypeError):
            return  # a broken or foreign connection: its task reports by its result
