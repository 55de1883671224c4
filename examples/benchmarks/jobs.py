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
    command = [sys.executable, "-m", "tf_bps.launch", "-np", str(num_workers)]
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
    launch = [sys.executable, "-m", "tf_bps.launch"]
    roles = [(on(hosts, launch), {"DMLC_ROLE": "scheduler"})]
    roles += [(on(hosts + i, launch), {"DMLC_ROLE": "server"}) for i in range(num_servers)]
    for host in range(hosts):
        where = {} if bed else {"DMLC_NODE_HOST": f"127.0.0.{host + 1}"}
        roles.append((on(host, [*launch, *worker_command]),
                      {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(host), **where}))
    outputs = run_processes([(command, {**common, **role_env}) for command, role_env in roles])
    if output is not None:
        output.append("".join(outputs))
    return _read(out_path)


def run_tf_bps_over_ssh(bed, ssh, worker_command: list[str], out_path: str,
                        env: dict[str, str] | None = None) -> dict:
    """2 worker hosts (bed hosts 0 and 1, one worker each) and 2 server hosts (2 and 3),
    started from host 0 with `bpslaunch -H` over ssh (tests/netbed.py)."""
    command = bed.command(0, [
        sys.executable, "-m", "tf_bps.launch", *ssh.ssh_options(),
        "-H", f"{bed.address(0)}:1,{bed.address(1)}:1",
        "--server-hosts", f"{bed.address(2)},{bed.address(3)}", *worker_command])
    done = subprocess.run(command, env=env or dict(os.environ), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"the job failed:\n{done.stdout}{done.stderr}")
    return _read(out_path)


def run_processes(commands: list[tuple[list[str], dict]]) -> list[str]:
    """Runs (command, environment) pairs side by side; their outputs, once every one
    succeeded. The first failure is raised with its output; nothing is left running."""
    processes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
                 for command, env in commands]
    try:
        outputs = [process.communicate(timeout=TIMEOUT_S)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, text in zip(processes, outputs, strict=True):
        if process.returncode != 0:
            raise RuntimeError(f"{process.args} failed:\n{text}")
    return outputs


def mwms_all_reduce():
    """In a worker TF_CONFIG describes: a function averaging a tensor over the workers
    with MultiWorkerMirroredStrategy's RING all-reduce (gRPC), returning this worker's
    copy of the result."""
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    @tf.function
    def all_reduce(t):
        def replica_fn(value):
            context = tf.distribute.get_replica_context()
            # A tensor placed on the replica device: all_reduce needs a destination.
            return context.all_reduce(tf.distribute.ReduceOp.MEAN, tf.identity(value))

        return strategy.run(replica_fn, args=(t,))

    return lambda tensor: strategy.experimental_local_results(all_reduce(tensor))[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_mwms(worker_command: list[str], out_path: str, num_workers: int, bed=None) -> dict:
    """A MultiWorkerMirroredStrategy job through TF_CONFIG: on this machine, or with a
    tests/netbed.py NetBed, worker i on its host i."""
    def address(index: int) -> str:
        return f"{bed.address(index)}:29500" if bed else f"127.0.0.1:{_free_port()}"

    cluster = {"worker": [address(index) for index in range(num_workers)]}

    def env(index: int) -> dict:
        task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        return {**os.environ, "TF_CONFIG": json.dumps(task)}

    run_processes([(bed.command(index, worker_command) if bed else worker_command, env(index))
                   for index in range(num_workers)])
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


def server_pids(launcher: int) -> list[int]:
    """The servers a bpslaunch process (`launcher`) started: its children running the
    native server, found in /proc."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == launcher and b"bps_server" in command:
            found.append(int(entry))
    return sorted(found)
