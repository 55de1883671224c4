"""Starting the two sides of a benchmark: a tf_bps job through bpslaunch, and a
MultiWorkerMirroredStrategy job through TF_CONFIG. Rank 0 (task 0) writes its figures
as JSON to a file, which is what both functions return."""

from __future__ import annotations

import json
import os
import re
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


def run_tf_bps_hosts(worker_command: list[str], out_path: str, hosts: int, local_size: int,
                     num_servers: int, env: dict[str, str] | None = None,
                     output: list[str] | None = None, bed=None) -> dict:
    """A job as on `hosts` machines of `local_size` workers each, started role by role.
    Without `bed`, each emulated machine advertises its own loopback address
    (DMLC_NODE_HOST); with a tests/netbed.py NetBed, workers run on its hosts 0.., the
    scheduler with server 0 on host `hosts`, and server i on host `hosts + i`."""
    def on(host: int, command: list[str]) -> list[str]:
        return bed.command(host, command) if bed else command

    root = bed.address(hosts) if bed else "127.0.0.1"
    common = {**os.environ, "DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": str(_free_port()),
              "DMLC_NUM_WORKER": str(hosts), "DMLC_NUM_SERVER": str(num_servers),
              "BYTEPS_LOCAL_SIZE": str(local_size), **(env or {})}
    launch = [sys.executable, "-m", "tf_bps.launcher"]
    roles = [(on(hosts, launch), {"DMLC_ROLE": "scheduler"})]
    roles += [(on(hosts + i, launch), {"DMLC_ROLE": "server"}) for i in range(num_servers)]
    for host in range(hosts):
        where = {} if bed else {"DMLC_NODE_HOST": f"127.0.0.{host + 1}"}
        roles.append((on(host, [*launch, *worker_command]),
                      {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(host), **where}))
    processes = [subprocess.Popen(command, env={**common, **role_env}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for command, role_env in roles]
    try:
        outputs = [process.communicate(timeout=TIMEOUT_S)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, text in zip(processes, outputs, strict=True):
        if process.returncode != 0:
            raise RuntimeError(f"the tf_bps job failed:\n{text}")
    if output is not None:
        output.append("".join(outputs))
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


def server_traffic(output: str) -> dict[str, tuple[int, int]]:
    """Bytes (in, out) per tensor name, summed over the servers' DEBUG lines (servers
    log each tensor's traffic when they stop, with BYTEPS_LOG_LEVEL=DEBUG)."""
    moved: dict[str, tuple[int, int]] = {}
    for name, bytes_in, bytes_out in re.findall(
            r"tensor '([^']+)' moved (\d+) bytes in and (\d+) bytes out", output):
        was_in, was_out = moved.get(name, (0, 0))
        moved[name] = (was_in + int(bytes_in), was_out + int(bytes_out))
    return moved
