"""Starting the two sides of a benchmark: a tf_bps job through bpslaunch, and a
MultiWorkerMirroredStrategy job through TF_CONFIG. Rank 0 (task 0) writes its figures
as JSON to a file, which is what both functions return."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

TIMEOUT_S = 900


def _read(path: str) -> dict:
    with open(path) as results:
        return json.load(results)


def run_tf_bps(worker_command: list[str], out_path: str, num_workers: int,
               num_servers: int | None = None, env: dict[str, str] | None = None,
               output: list[str] | None = None) -> dict:
    """The figures rank 0 wrote; the job's printed output goes to `output` if given."""
    command = [sys.executable, "-m", "tf_bps.launcher", "-np", str(num_workers)]
    if num_servers is not None:
        command += ["--num-servers", str(num_servers)]
    done = subprocess.run([*command, *worker_command], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"the tf_bps job failed:\n{done.stdout}{done.stderr}")
    if output is not None:
        output.append(done.stdout + done.stderr)
    return _read(out_path)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_mwms(worker_command: list[str], out_path: str, num_workers: int) -> dict:
    cluster = {"worker": [f"127.0.0.1:{_free_port()}" for _ in range(num_workers)]}
    processes = []
    for index in range(num_workers):
        tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        processes.append(subprocess.Popen(
            worker_command, env={**os.environ, "TF_CONFIG": json.dumps(tf_config)},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    try:
        for process in processes:
            _, errors = process.communicate(timeout=TIMEOUT_S)
            if process.returncode != 0:
                raise RuntimeError(f"a MultiWorkerMirroredStrategy worker failed:\n{errors}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return _read(out_path)


def is_mwms_chief() -> bool:
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0
