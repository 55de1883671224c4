"""bpslaunch: starts one role of a job (with DMLC_ROLE) or a whole job on this machine.

    DMLC_ROLE=scheduler bpslaunch
    DMLC_ROLE=server bpslaunch
    DMLC_ROLE=worker DMLC_WORKER_ID=0 ... bpslaunch python train.py
    bpslaunch -np 2 [--num-servers 2] python train.py
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from tf_bps.config import Config, ConfigError

# How long servers and the scheduler get to exit by themselves once the workers are done,
# and how long the workers get to report their own error once a server has failed.
EXIT_GRACE_S = 30.0
FAILURE_GRACE_S = 5.0
TERMINATE_GRACE_S = 3.0


class LaunchError(RuntimeError):
    """A process of the job could not be started; everything started is ended."""


@dataclass
class Child:
    label: str  # "worker 0", "server 1", "scheduler"
    process: subprocess.Popen
    is_worker: bool


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class JobSupervisor:
    """Starts processes, prefixes worker output, and ends the job as a whole."""

    def __init__(self):
        self.children: list[Child] = []
        self._exits: queue.Queue[Child] = queue.Queue()
        self._output_lock = threading.Lock()
        self._pumps: list[threading.Thread] = []

    def start(self, label: str, command: list[str], env: dict[str, str], is_worker: bool,
              prefix: str | None = None) -> None:
        pipe = subprocess.PIPE if prefix is not None else None
        try:
            process = subprocess.Popen(command, env=env, stdout=pipe, stderr=pipe,
                                       start_new_session=True)
        except OSError as error:
            self.terminate()
            raise LaunchError(f"cannot start {label} ({command[0]!r}): "
                              f"{error.strerror or error}") from None
        child = Child(label, process, is_worker)
        self.children.append(child)
        if prefix is not None:
            for source, sink in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
                pump = threading.Thread(target=self._pump, args=(source, sink, prefix),
                                        daemon=True)
                pump.start()
                self._pumps.append(pump)
        threading.Thread(target=self._wait, args=(child,), daemon=True).start()

    def _pump(self, source, sink, prefix: str) -> None:
        tag = prefix.encode()
        for line in iter(source.readline, b""):
            with self._output_lock:
                sink.buffer.write(tag + line)
                sink.flush()

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

    @staticmethod
    def _signal(child: Child, sig: int) -> None:
        try:
            os.killpg(child.process.pid, sig)  # Its own session: the group id is its pid.
        except ProcessLookupError:
            pass

    def run(self) -> int:
        """Waits for the workers in the order they exit; returns the job's status."""
        workers_left = sum(c.is_worker for c in self.children)
        others_left = len(self.children) - workers_left
        failed_helper: tuple[Child, float] | None = None
        try:
            while workers_left:
                timeout = None
                if failed_helper is not None:
                    timeout = max(0.0, failed_helper[1] - time.monotonic())
                try:
                    child = self._exits.get(timeout=timeout)
                except queue.Empty:
                    helper = failed_helper[0]
                    self._report(f"{helper.label} exited with status "
                                 f"{_exit_status(helper.process.returncode)}; ending the job")
                    return _exit_status(helper.process.returncode) or 1
                status = _exit_status(child.process.returncode)
                if child.is_worker:
                    workers_left -= 1
                    if status != 0:
                        self._report(f"{child.label} failed with status {status}; "
                                     "ending the job")
                        return status
                else:
                    others_left -= 1
                    if status != 0 and failed_helper is None:
                        # The workers will see the failure themselves; let them say why.
                        failed_helper = (child, time.monotonic() + FAILURE_GRACE_S)
            deadline = time.monotonic() + EXIT_GRACE_S
            while others_left:
                try:
                    child = self._exits.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    self._report("servers or scheduler did not exit after the workers finished")
                    return 1
                others_left -= 1
            return 0
        finally:
            self.terminate()
            for pump in self._pumps:
                pump.join(timeout=1)

    @staticmethod
    def _report(message: str) -> None:
        print(f"bpslaunch: {message}", file=sys.stderr, flush=True)


def _resolve_command(command: list[str]) -> str | None:
    """Why `command` cannot start (checked before anything is started), or None."""
    program = command[0]
    if os.sep in program:
        if not os.path.isfile(program):
            return f"cannot run {program!r}: no such file"
        if not os.access(program, os.X_OK):
            return f"cannot run {program!r}: not executable"
        return None
    if shutil.which(program) is None:
        return f"cannot run {program!r}: command not found on PATH"
    return None


def _under_gdb(command: list[str]) -> list[str]:
    """BYTEPS_ENABLE_GDB=1: the worker runs under gdb in batch mode, which prints the
    backtrace of every thread if it crashes and exits with the worker's status."""
    if shutil.which("gdb") is None:
        raise LaunchError("BYTEPS_ENABLE_GDB=1 needs gdb, which is not on PATH "
                          "(apt-get install gdb)")
    return ["gdb", "-q", "-batch", "-return-child-result", "-ex", "set pagination off",
            "-ex", "set print thread-events off", "-ex", "run", "-ex", "thread apply all bt",
            "--args", *command]


def _launch_local_job(num_workers: int, num_servers: int, command: list[str]) -> int:
    base = dict(os.environ)
    config = Config.from_env(base)
    single = num_workers == 1 and not config.force_distributed
    supervisor = JobSupervisor()
    if not single:
        # One token for every process of this job, unless the user brought one.
        base.setdefault("BYTEPS_JOB_TOKEN", secrets.token_hex(16))
        base.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(_free_port()),
                    DMLC_NUM_WORKER=str(num_workers), DMLC_NUM_SERVER=str(num_servers),
                    BYTEPS_LOCAL_SIZE="1", BYTEPS_LOCAL_RANK="0")
        python = sys.executable
        supervisor.start("scheduler", [python, "-m", "tf_bps.scheduler"],
                         {**base, "DMLC_ROLE": "scheduler"}, is_worker=False)
        for server in range(num_servers):
            supervisor.start(f"server {server}", [python, "-m", "tf_bps.server"],
                             {**base, "DMLC_ROLE": "server"}, is_worker=False)
    else:
        base.update(DMLC_NUM_WORKER="1", BYTEPS_LOCAL_SIZE="1", BYTEPS_LOCAL_RANK="0")
    # TF_CONFIG as TensorFlow's multi-worker recipes read it (the worker count, this
    # worker's index), unless the user set one.
    cluster = {"worker": [f"127.0.0.1:{_free_port()}" for _ in range(num_workers)]}
    for rank in range(num_workers):
        env = {**base, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(rank),
               **_horovod_variables(rank, num_workers, rank, num_workers)}
        if "TF_CONFIG" not in base and num_workers > 1:
            env["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                           "task": {"type": "worker", "index": rank}})
        supervisor.start(f"worker {rank}", command, env, is_worker=True, prefix=f"[{rank}]: ")
    return _supervise(supervisor)


def _horovod_variables(rank: int, size: int, local_rank: int, local_size: int) -> dict:
    """What horovodrun tells each process, for scripts and tests that read it."""
    return {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size)}


def _launch_local_ranks(config: Config, command: list[str]) -> int:
    """DMLC_ROLE=worker with BYTEPS_LOCAL_SIZE > 1, or several visible GPUs: one process
    per local rank (each uses the GPU of its local rank, see basics._pin_gpu)."""
    supervisor = JobSupervisor()
    for local_rank in range(config.local_size):
        rank = config.worker_id * config.local_size + local_rank
        env = {**os.environ, "BYTEPS_LOCAL_RANK": str(local_rank),
               "BYTEPS_LOCAL_SIZE": str(config.local_size),
               **_horovod_variables(rank, config.size, local_rank, config.local_size)}
        supervisor.start(f"worker {rank}", command, env, is_worker=True, prefix=f"[{rank}]: ")
    return _supervise(supervisor)


def _supervise(supervisor: JobSupervisor) -> int:
    def on_signal(signum, frame):
        supervisor.terminate()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return supervisor.run()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bpslaunch",
        description="Start a tf_bps job. With DMLC_ROLE set, run that one role; without it, "
                    "start a scheduler, servers and -np workers on this machine.")
    parser.add_argument("-np", "--num-workers", type=int, dest="num_workers",
                        help="workers to start on this machine (without DMLC_ROLE)")
    parser.add_argument("--num-servers", type=int, help="servers to start (default: -np)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the worker's command (may follow a `--`)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    try:
        config = Config.from_env()
    except ConfigError as error:
        print(f"bpslaunch: {error}", file=sys.stderr)
        return 2
    if config.role == "scheduler":
        from tf_bps import scheduler

        return scheduler.main()
    if config.role == "server":
        from tf_bps import server

        return server.main()
    if not args.command:
        print("bpslaunch: no command to run for the workers", file=sys.stderr)
        return 2
    problem = _resolve_command(args.command)
    if problem:
        print(f"bpslaunch: {problem}", file=sys.stderr)
        return 127
    if config.enable_gdb:
        try:
            args.command = _under_gdb(args.command)
        except LaunchError as error:
            print(f"bpslaunch: {error}", file=sys.stderr)
            return 127
    if config.role == "worker":
        if config.local_size > 1 and "BYTEPS_LOCAL_RANK" not in os.environ:
            return _run(_launch_local_ranks, config, args.command)
        os.execvp(args.command[0], args.command)
    if args.num_workers is None or args.num_workers < 1:
        print("bpslaunch: set DMLC_ROLE (scheduler, server or worker), or give -np N to start "
              "a whole job on this machine", file=sys.stderr)
        return 2
    num_servers = args.num_servers if args.num_servers is not None else args.num_workers
    if num_servers < 1:
        print("bpslaunch: --num-servers must be at least 1", file=sys.stderr)
        return 2
    return _run(_launch_local_job, args.num_workers, num_servers, args.command)


def _run(launch, *args) -> int:
    try:
        return launch(*args)
    except LaunchError as error:
        print(f"bpslaunch: {error}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
