"""The executor's side of a Spark job: what each barrier task does.

The task's partition is its rank. The lowest partition of the attempt asks the driver
for the attempt's job (scheduler address and token) and shares it with the others
through `allGather`; the lowest partition on each machine starts that machine's server;
then every task runs its rank in a process of its own (worker.py) with the job's
variables, and waits for it. A rank's failure is a result ("error", traceback), not a
Spark task failure, so Spark does not start the function again; the driver names the
rank. Every task then waits for the others (`allGather`) before the servers are ended,
so no server leaves while a rank still needs it.

Every process a task starts dies with it (PR_SET_PDEATHSIG on Linux): when Spark kills
a task (the job was cancelled, another task of the barrier stage failed, an executor
was lost), nothing of the job is left behind on that executor.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from tf_bps.launch.lifeline import dies_with_this_process
from tf_bps.launch.output import is_tf_start_up_notice
from tf_bps.spark.driver import TaskPlan
from tf_bps.spark.layout import SparkLayout, plan_layout

# How long a server gets to exit by itself once every rank is done (it does when the
# workers have shut down), and after a failure.
SERVER_EXIT_GRACE_S = 30.0
SERVER_FAILURE_GRACE_S = 2.0
TERMINATE_GRACE_S = 3.0
CONNECT_TIMEOUT_S = 30.0


def barrier_task(plan: TaskPlan):
    """The function mapPartitions runs in every barrier task."""
    def task(_rows):
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        partition = context.partitionId()
        layout = plan_layout([info.address for info in context.getTaskInfos()])
        message = _ask_for_job(plan, layout) if partition == 0 else ""
        job = json.loads(context.allGather(message)[0])
        if "error" in job:
            yield partition, "error", job["error"]
            return
        server = None
        try:
            if layout.starts_server(partition):
                server = _start_server({**os.environ, **plan.env, **job["variables"],
                                        **layout.server_variables(partition)})
            kind, payload = run_rank(plan, partition, job["job"],
                                     {**job["variables"], **layout.variables(partition)})
        except Exception as error:  # noqa: BLE001 - every task must reach the allGather
            kind, payload = "error", f"the Spark task could not start its server: {error!r}"
        # Everyone is done (or failed) before a server goes: kinds tell which.
        kinds = context.allGather(kind)
        if server is not None:
            _stop_server(server, all(k == "ok" for k in kinds))
        yield partition, kind, payload
    return task


def _ask_for_job(plan: TaskPlan, layout: SparkLayout) -> str:
    """The driver's answer for this attempt, as JSON ({"error": ...} if it failed)."""
    request = {"secret": plan.secret, "kind": "job", "num_proc": layout.num_proc,
               "machines": len(layout.machines),
               "workers": layout.num_proc // layout.local_size, "note": layout.reason}
    try:
        with socket.create_connection(plan.driver, timeout=CONNECT_TIMEOUT_S) as sock:
            sock.sendall(json.dumps(request).encode() + b"\n")
            answer = sock.makefile("rb").readline()
        json.loads(answer)["job"]
        return answer.decode()
    except (OSError, ValueError, KeyError) as error:
        return json.dumps({"error": f"the Spark task of rank 0 could not get the job from "
                                    f"the driver at {plan.driver[0]}:{plan.driver[1]}: {error}"})


class _Events:
    """This rank's connection to the driver; without one, events are dropped (the
    result still says what happened)."""

    def __init__(self, plan: TaskPlan, job: int, rank: int):
        self._lock = threading.Lock()
        try:
            self._sock = socket.create_connection(plan.driver, timeout=CONNECT_TIMEOUT_S)
            self._send({"secret": plan.secret, "kind": "task", "job": job, "rank": rank})
        except OSError:
            self._sock = None

    def _send(self, message: dict) -> None:
        if self._sock is None:
            return
        with self._lock:
            try:
                self._sock.sendall(json.dumps(message).encode() + b"\n")
            except OSError:
                self._sock = None

    def event(self, kind: str, **fields) -> None:
        self._send({"event": kind, **fields})

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()


def run_rank(plan: TaskPlan, partition: int, job: int,
             variables: dict[str, str]) -> tuple[str, object]:
    """Runs the rank with the job's `variables`; ("ok", pickled result) or ("error",
    why). Never raises: every task of a barrier stage must reach the allGather that
    follows."""
    events = _Events(plan, job, partition)
    try:
        with tempfile.TemporaryDirectory(prefix="tf_bps_spark_") as folder:
            result_file = os.path.join(folder, "result")
            process = _start(
                [sys.executable, "-m", "tf_bps.spark.worker", result_file],
                {**os.environ, **plan.env, **variables}, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE if plan.forward_stdout else None,
                stderr=subprocess.PIPE if plan.forward_stderr else None)
            pumps = [threading.Thread(target=_pump, daemon=True,
                                      args=(source, name, events, plan.hide_tf_notices))
                     for source, name in ((process.stdout, "stdout"), (process.stderr, "stderr"))
                     if source is not None]
            for pump in pumps:
                pump.start()
            events.event("started")
            try:
                process.stdin.write(plan.payload)
                process.stdin.close()
            except BrokenPipeError:
                pass  # It exited already; its status says why.
            status = process.wait()
            for pump in pumps:
                pump.join(timeout=5)
            kind, payload = _outcome(result_file, status)
    except Exception as error:  # noqa: BLE001 - the task must report, not raise
        kind, payload = "error", f"the Spark task could not run it: {error!r}"
    if kind == "error":
        events.event("failed", message=_summary(payload))
    events.close()
    return kind, payload


def _outcome(result_file: str, status: int) -> tuple[str, object]:
    try:
        with open(result_file, "rb") as result:
            kind, payload = pickle.loads(result.read())
    except (OSError, EOFError, ValueError, ImportError, AttributeError):
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        return "error", f"its process {how} before returning"
    return kind, payload


def _summary(text: str) -> str:
    """The last line of a traceback: the exception and its message."""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1] if lines else "failed"


def _pump(source, stream: str, events: _Events, hide_tf_notices: bool) -> None:
    for line in iter(source.readline, b""):
        if not (hide_tf_notices and is_tf_start_up_notice(line)):
            events.event("output", stream=stream, line=line.decode(errors="replace"))


def _start(command: list[str], env: dict[str, str], **pipes) -> subprocess.Popen:
    """A process that dies with this task (Linux), in a session of its own."""
    return subprocess.Popen(command, env=env, start_new_session=True,
                            preexec_fn=dies_with_this_process(), **pipes)


def _start_server(env: dict[str, str]) -> subprocess.Popen:
    from tf_bps.runtime.core import server_executable

    return _start([str(server_executable())], env, stdin=subprocess.DEVNULL)


def _stop_server(server: subprocess.Popen, success: bool) -> None:
    """Gives this task's server time to exit by itself, then ends it."""
    deadline = time.monotonic() + (SERVER_EXIT_GRACE_S if success else SERVER_FAILURE_GRACE_S)
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            try:
                os.killpg(server.pid, sig)
            except ProcessLookupError:
                return
        try:
            server.wait(timeout=max(0.0, deadline - time.monotonic()))
            return
        except subprocess.TimeoutExpired:
            deadline = time.monotonic() + TERMINATE_GRACE_S
