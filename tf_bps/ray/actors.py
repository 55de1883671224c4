"""The Ray actors of a job: one per worker, and one per scheduler or server process.

Plain classes: the executor makes them remote with the resources and placement it
chose. Each actor is a process Ray started; a worker actor joins the tf_bps job in that
process and runs the user's functions there, so the job lives as long as the actors."""

from __future__ import annotations

import os
import socket
import subprocess

import ray

from tf_bps.launch.lifeline import dies_with_this_process
from tf_bps.launch.supervisor import helper_plan
from tf_bps.ray.layout import WorkerNode


def _node() -> tuple[str, str]:
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


class Worker:
    """One rank. `executable_cls`, when given, is built once the job is joined, and
    `execute(fn)` hands it to fn (Horovod's RayExecutor does the same)."""

    def __init__(self, executable_cls=None, executable_args=(), executable_kwargs=None):
        self._executable_spec = (executable_cls, tuple(executable_args or ()),
                                 dict(executable_kwargs or {}))
        self.executable = None
        self.rank = None

    def where(self) -> WorkerNode:
        node_id, address = _node()
        return WorkerNode(node_id, address, tuple(str(gpu) for gpu in ray.get_gpu_ids()))

    def join(self, variables: dict[str, str]) -> int:
        """Joins the job that `variables` describe (bps.init(); a training function that
        calls it again finds it done) and returns the rank the scheduler gave."""
        os.environ.update(variables)
        from tf_bps.runtime import basics

        basics.init()
        self.rank = basics.rank()
        executable_cls, args, kwargs = self._executable_spec
        if executable_cls is not None:
            self.executable = executable_cls(*args, **kwargs)
        return self.rank

    def join_and_run(self, variables: dict[str, str], fn, args=(), kwargs=None):
        """For an elastic job: fn(*args, **kwargs) with the job's `variables` set; fn
        joins (bps.init()) when it is ready to, and trains in tf_bps.elastic.run."""
        os.environ.update(variables)
        return _failing_the_job(fn, *args, **(kwargs or {}))

    def run(self, fn, args=(), kwargs=None):
        """fn(*args, **kwargs) in the job this worker joined."""
        return self._guarded(fn, *args, **(kwargs or {}))

    def execute(self, fn):
        return self._guarded(fn, self.executable)

    def _guarded(self, fn, *args, **kwargs):
        from tf_bps.runtime import basics

        if not basics.is_initialized():
            raise RuntimeError(f"worker rank {self.rank} is not in a job any more (its "
                               "training function called bps.shutdown(), or the job failed): "
                               "shut the executor down and start it again")
        return _failing_the_job(fn, *args, **kwargs)

    def leave(self) -> None:
        from tf_bps.runtime import basics

        basics.shutdown()


def _failing_the_job(fn, *args, **kwargs):
    """fn(*args, **kwargs); if it raises, this worker leaves its job as failed, so the
    other workers end at once with the reason instead of waiting for this one."""
    from tf_bps.runtime import basics

    try:
        return fn(*args, **kwargs)
    except BaseException as error:
        basics.leave_failed(f"{type(error).__name__}: {error}")
        raise


class JobProcess:
    """Runs the job's scheduler or one server on this actor's node, as a child that dies
    with the actor (Ray ends actors with SIGKILL, which leaves no time to clean up). Its
    output goes where the actor's goes: Ray's log files, shown on the driver."""

    def __init__(self):
        self._process: subprocess.Popen | None = None

    def where(self) -> tuple[str, str]:
        return _node()

    def free_port(self) -> int:
        with socket.socket() as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]

    def start(self, role: str, job: dict[str, str]) -> int:
        plan = helper_plan(role, role, job)
        self._process = subprocess.Popen(plan.command, env={**os.environ, **plan.env},
                                         stdin=subprocess.DEVNULL,
                                         preexec_fn=dies_with_this_process())
        return self._process.pid

    def exit_status(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def stop(self, grace_s: float) -> int | None:
        """Waits up to `grace_s` for the process to end by itself (a job whose workers
        left ends its scheduler and servers), then ends it."""
        if self._process is None:
            return None
        try:
            return self._process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._process.terminate()
        try:
            return self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            return self._process.wait()
