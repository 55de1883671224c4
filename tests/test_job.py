"""Broadcast, gradients, the local path, errors and the lifetime of real jobs."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from harness import (
    LAUNCH,
    base_env,
    descendants,
    finish,
    free_port,
    module_job,
    runs,
    worker_command,
)
from harness import marked_json as reports

from tf_bps.runtime.config import Config, ConfigError
from tf_bps.runtime.core import server_executable


@module_job
def role_job(processes, _):
    """broadcast_gradient.py in a job of 2 workers and 2 servers started role by role,
    shared by the two tests below: each process's (exit status, output), and the seconds
    from the start to the last exit."""
    job = processes.start_job_by_role(2, 2, "broadcast_gradient.py")
    started = time.monotonic()
    outputs = {label: finish(process, timeout=60) for label, process in job.items()}
    return outputs, time.monotonic() - started


def test_broadcast_and_gradients(role_job):
    outputs, _ = role_job
    output = outputs["worker0"][1] + outputs["worker1"][1]
    assert outputs["worker0"][0] == outputs["worker1"][0] == 0, output
    got = reports(output)
    assert sorted(got) == [0, 1], output
    for report in got.values():
        assert report["broadcast"] == [2.5, -1.0]
        assert report["broadcast_bool"] == [True, True]
        assert report["variables"] == [[0.0, 0.0, 0.0], 7]
        assert report["grad_sum"] == [3.0, 3.0, 3.0]  # (0 + 1) + (1 + 1)
        # d/dv of mean over ranks of 2v, weighted by (r + 1): 2 * (1 + 2) / 2.
        assert report["grad_average_fn"] == [3.0, 3.0, 3.0]
        assert "root_rank=2" in report["bad_root"]


def test_single_worker_needs_no_scheduler(procs):
    # No DMLC variables at all: nothing listens anywhere, push_pull is local.
    status, output = procs.run(worker_command("local_path.py"), base_env())
    assert status == 0, output
    report = reports(output)[0]
    assert report["size"] == 1 and report["local_size"] == 1
    assert report["sum"] == report["avg"] == [1.0, 2.0, 3.0]
    assert report["bcast"] == [4, 5] and report["int_avg"] == [7, -7]


def test_force_distributed_single_worker_uses_servers(procs):
    status, output = procs.launch(1, "local_path.py", num_servers=1, BYTEPS_FORCE_DISTRIBUTED=1,
                                  BYTEPS_LOG_LEVEL="INFO")
    assert status == 0, output
    assert "connected to 1 server(s)" in output  # The core logged its server link.
    assert reports(output)[0]["sum"] == [1.0, 2.0, 3.0]


def test_scheduler_and_launcher_import_no_tensorflow(procs):
    probe = ("import sys, tf_bps, tf_bps.control.server, tf_bps.control.scheduler, "
             "tf_bps.launch.bpslaunch; "
             "print('tensorflow' in sys.modules, 'tf_bps._bps_worker' in sys.modules)")
    status, output = procs.run([sys.executable, "-c", probe], base_env())
    assert (status, output.strip()) == (0, "False False")


def test_the_server_is_a_native_program_needing_no_newer_glibc_than_2_28():
    # Linked statically, it needs no shared library and no versioned glibc symbol; any
    # dynamic symbol it ever needs again must exist in glibc 2.28 (RHEL 8, Debian 10).
    needed = subprocess.run(["readelf", "-d", str(server_executable())], capture_output=True,
                            text=True, check=True).stdout
    libraries = set(re.findall(r"Shared library: \[([^\]]+)\]", needed))
    assert libraries <= {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2"}, libraries
    symbols = subprocess.run(["objdump", "-T", str(server_executable())], capture_output=True,
                             text=True).stdout  # "not a dynamic object" when static
    versions = [(int(major), int(minor))
                for major, minor in re.findall(r"\bGLIBC_(\d+)\.(\d+)", symbols)]
    assert max(versions, default=(0, 0)) <= (2, 28), sorted(set(versions))[-5:]


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_the_server_serves_a_job_from_an_empty_root(procs, tmp_path):
    # The operator's "copy one file" server: in a root holding nothing but the program
    # (no libc, no /etc, no /tmp), it registers and sums a job's pushes right.
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(server_executable(), root / "bps_server")
    job = procs.start_job_by_role(2, 0, "steady_sums.py", DMLC_NUM_SERVER=1,
                                  BYTEPS_ENABLE_IPC=0, BYTEPS_JOB_TOKEN="copied to them all",
                                  TEST_ROUNDS=20)
    server = procs.start(["chroot", str(root), "/bps_server"],
                         base_env(DMLC_ROLE="server", **procs.job_env))
    outputs = {}
    for name, process in [*job.items(), ("server", server)]:
        status, outputs[name] = finish(process, timeout=120)
        assert status == 0, (name, outputs[name])
    for rank in range(2):
        assert f"SUMS OK {rank}" in outputs[f"worker{rank}"], outputs


def test_the_native_server_answers_help_and_version():
    import tf_bps

    server = str(server_executable())
    version = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=10)
    assert version.returncode == 0 and version.stdout == (
        f"bps_server (tf_bps) {tf_bps.__version__}\n"), version
    usage = subprocess.run([server, "--help"], capture_output=True, text=True, timeout=10)
    assert usage.returncode == 0 and "DMLC_PS_ROOT_URI" in usage.stdout, usage
    stray = subprocess.run([server, "--port", "9000"], capture_output=True, text=True,
                           timeout=10)
    assert stray.returncode == 2, stray
    assert "unexpected argument '--port'" in stray.stderr and "usage:" in stray.stderr, stray


# Bad values of every kind in settings.def, and the rules that tie variables together.
SERVER_CHECKS = [
    {"DMLC_NUM_WORKER": "two"},
    {"DMLC_NUM_WORKER": "0"},
    {"DMLC_NUM_SERVER": "1_0000"},
    {"BYTEPS_PARTITION_BYTES": " -4 "},
    {"BYTEPS_MAX_TENSOR_BYTES": "1e9"},
    {"DMLC_ENABLE_RDMA": "1"},
    {"DMLC_ENABLE_RDMA": "yes"},
    {"BYTEPS_SERVER_ENABLE_SCHEDULE": "1"},
    {"BYTEPS_LOG_LEVEL": "LOUD"},
    {"BYTEPS_LOG_LEVEL": "it's"},
    {"PS_VERBOSE": "7"},
    {"PS_HEARTBEAT_TIMEOUT": "nan"},
    {"PS_HEARTBEAT_INTERVAL": "0"},
    {"BYTEPS_OP_TIMEOUT": "0x10"},
    {"GLOO_TIMEOUT_SECONDS": "2e6"},
    {"PERSEUS_GRADIENT_MOMENTUM": "1.5"},
    {"PERSEUS_ALLREDUCE_DTYPE": "3"},
    {"BYTEPS_PCIE_SWITCH_SIZE": "0"},
    {"PS_HEARTBEAT_INTERVAL": "5", "PS_HEARTBEAT_TIMEOUT": "4.5"},
    {"BYTEPS_TRACE_START_STEP": "30"},
    {"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "2"},
    {"DMLC_ROLE": "worker"},
    {"DMLC_PS_ROOT_PORT": ""},
    {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9", "DMLC_NUM_SERVER": "0"},
    {"DMLC_INTERFACE": "nosuchnic0"},
    {"PS_VERBOSE": "0|1"},
    {"BYTEPS_LOCAL_RANK": "1"},
    {"CUDA_VISIBLE_DEVICES": "all"},
    {"NVIDIA_VISIBLE_DEVICES": "0,1", "BYTEPS_LOCAL_RANK": "2"},
    {"DMLC_NUM_WORKER": "4096", "BYTEPS_LOCAL_SIZE": "2"},
]


@pytest.mark.parametrize("env", SERVER_CHECKS, ids=lambda env: ",".join(env))
def test_the_native_server_checks_variables_as_python_does(procs, env):
    """One table (custom_ops/control/settings.def) for both sides: the native server refuses what
    config.py refuses, with the same message."""
    job = {"DMLC_ROLE": "server", "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": "9", **env}
    job = {name: value for name, value in job.items() if value}  # "": unset
    try:
        config = Config.from_env(job)
        if config.role != "server":
            raise ConfigError(f"DMLC_ROLE={config.role!r} but this is a server; set "
                              "DMLC_ROLE=server")
        config.require_rendezvous()
        config.advertised_host()
        pytest.fail(f"config.py accepts {env}")
    except ConfigError as error:
        expected = f"tf_bps server: {error}"
    status, output = procs.run([str(server_executable())], {**base_env(), **job})
    assert (status, output.strip()) == (2, expected)


def test_bad_variables_are_named(procs):
    cases = [
        ({"DMLC_NUM_WORKER": "two"}, "DMLC_NUM_WORKER='two'"),
        ({"DMLC_ENABLE_RDMA": "1"}, "TCP"),
        ({"DMLC_ENABLE_RDMA": "yes"}, "DMLC_ENABLE_RDMA='yes' is not valid: expected 0 or 1"),
        ({"DMLC_ROLE": "boss"}, "expected one of scheduler, server, worker"),
        ({"BYTEPS_LOG_LEVEL": "LOUD"}, "BYTEPS_LOG_LEVEL='LOUD'"),
        ({"BYTEPS_PARTITION_BYTES": "-4"}, "BYTEPS_PARTITION_BYTES='-4'"),
        ({"PS_VERBOSE": "7"}, "PS_VERBOSE='7'"),
        ({"BYTEPS_ENABLE_IPC": "on"}, "BYTEPS_ENABLE_IPC='on' is not valid"),
        ({"DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "2"}, "DMLC_WORKER_ID=2"),
        ({"DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1"},
         "DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT"),
        ({"DMLC_NUM_WORKER": "2", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9"},
         "DMLC_NUM_SERVER"),
        ({"DMLC_INTERFACE": "nosuchnic0", "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1",
          "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9"},
         "DMLC_INTERFACE='nosuchnic0'"),
    ]
    init = [sys.executable, "-c", "import tf_bps; tf_bps.init()"]
    for env, message in cases:
        status, output = procs.run(init, base_env(**env))
        assert status != 0 and message in output, (env, output)
    # The launcher and the server check the same variables before starting anything.
    status, output = procs.run([*LAUNCH, "-np", "2", "true"],
                               base_env(BYTEPS_SERVER_ENGINE_THREAD="0"))
    assert status == 2 and "BYTEPS_SERVER_ENGINE_THREAD='0'" in output
    status, output = procs.run([sys.executable, "-m", "tf_bps.control.server"],
                               base_env(DMLC_ROLE="server", DMLC_PS_ROOT_PORT="99999"))
    assert (status, output.strip()) == (
        2, "tf_bps server: DMLC_PS_ROOT_PORT='99999' is not valid: expected an integer from 1 "
        "to 65535")


def test_shape_and_dtype_mismatch_name_tensor_and_ranks(procs):
    # One job for both kinds (each under a name of its own, one after the other): the
    # job survives the first, so it can be told the second.
    status, output = procs.launch(2, "mismatch.py", "shape", "dtype", num_servers=2)
    assert status == 0, output
    errors = [line for line in output.splitlines() if "ERROR shape" in line]
    assert len(errors) == 2, output
    for line in errors:
        assert "'weights'" in line and "float32[2,3]" in line and "float32[3,2]" in line, line
        assert "rank 0" in line and "rank 1" in line, line
    assert output.count("AFTER shape [2.0, 2.0]") == 2, output

    errors = [line for line in output.splitlines() if "ERROR dtype" in line]
    assert len(errors) == 2 and all("float64[4]" in e and "float32[4]" in e for e in errors)
    assert output.count("AFTER dtype [2.0, 2.0]") == 2, output
    assert "NO ERROR" not in output, output


def _wait_ready(process, label):
    """Reads the worker's output up to READY (pytest-timeout bounds the wait)."""
    seen = []
    for line in process.stdout:
        if "READY" in line:
            return
        seen.append(line)
    raise AssertionError(f"{label} exited before it was ready: {''.join(seen)}")


def test_killed_server_fails_workers_quickly(procs):
    job = procs.start_job_by_role(2, 2, "loop.py", PS_HEARTBEAT_TIMEOUT=5)
    for rank in range(2):
        _wait_ready(job[f"worker{rank}"], f"worker {rank}")
    time.sleep(0.5)
    killed_at = time.monotonic()
    procs.end(job["server1"])
    for rank in range(2):
        status, output = finish(job[f"worker{rank}"], timeout=20)
        assert status == 3, output
        # EOF or a reset, depending on timing; either way the server and tensor are named.
        assert re.search(r"server \d \(127\.0\.0\.1:\d+\)[^\n]*\(tensor 'loop\d'\)",
                         output), output
    assert time.monotonic() - killed_at < 20
    # The workers report the lost server; the scheduler stops the rest of the job.
    status, output = finish(job["scheduler"], timeout=20)
    assert status == 1 and re.search(r"reported: [^\n]*server \d", output), output
    assert finish(job["server0"], timeout=20)[0] == 1


def test_killed_worker_fails_the_others_quickly(procs):
    job = procs.start_job_by_role(3, 1, "loop.py")
    for rank in range(3):
        _wait_ready(job[f"worker{rank}"], f"worker {rank}")
    procs.end(job["worker1"])
    for rank in (0, 2):
        status, output = finish(job[f"worker{rank}"], timeout=20)
        assert status == 3, output
        assert "worker rank 1" in output and "tensor 'loop" in output, output
    assert finish(job["scheduler"], timeout=20)[0] == 1
    assert finish(job["server0"], timeout=20)[0] == 1


def test_a_launcher_killed_outright_takes_its_whole_job_with_it(procs):
    # Each child has a session of its own (so that the launcher can end it by group),
    # and dies with the launcher however the launcher ends: nothing is left to run on.
    launcher = procs.start([*LAUNCH, "-np", "2", *worker_command("loop.py")], base_env())
    for _ in range(2):
        _wait_ready(launcher, "a worker")
    job = descendants(launcher.pid)
    assert len(job) >= 4, job  # the scheduler, the servers, two workers
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 10
    while (left := [pid for pid in job if runs(pid)]) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


@pytest.mark.parametrize("merge,waits_for", [("1", "worker rank 1"), ("0", "server 0")],
                         ids=["local-merge", "flat"])
def test_push_pull_without_partner_times_out_naming_tensor(procs, merge, waits_for):
    # With the local merge, worker 0 waits for its partner on this host; without, for
    # the server that never heard from it. The rendezvous, which waits for both workers
    # to import TensorFlow (a few seconds on two busy cores), has a bound of its own
    # (HOROVOD_START_TIMEOUT), so the operation's timeout can be short.
    job = procs.start_job_by_role(2, 1, "loop.py", "0", BYTEPS_OP_TIMEOUT=4,
                                  HOROVOD_START_TIMEOUT=60, BYTEPS_LOCAL_MERGE=merge)
    status, output = finish(job["worker0"], timeout=30)
    assert status == 3, output
    assert "timed out after 4 s" in output and "tensor 'loop0'" in output and waits_for in output


def test_clean_shutdown_ends_every_process(role_job):
    results, elapsed = role_job
    outputs = {}
    for label, (status, outputs[label]) in results.items():
        assert status == 0, f"{label}: {outputs[label]}"
    assert sorted(reports(outputs["worker0"] + outputs["worker1"])) == [0, 1]
    assert elapsed < 60


def test_launcher_returns_first_failure_and_ends_the_rest(procs):
    started = time.monotonic()
    status, output = procs.launch(2, "exit_with.py", "7", num_servers=1, timeout=60)
    assert status == 7, output
    assert "worker 1 failed with status 7" in output
    assert time.monotonic() - started < 40  # Rank 0 would sleep 60 s if left alone.


@pytest.mark.parametrize("placement", [{"BYTEPS_LOCAL_SIZE": 2}, {"NVIDIA_VISIBLE_DEVICES": "0,1"},
                                       {"CUDA_VISIBLE_DEVICES": "2,3"}],
                         ids=["local-size", "nvidia-visible-devices", "cuda-visible-devices"])
def test_launcher_starts_one_process_per_local_rank(procs, placement):
    # As BytePS's launcher: BYTEPS_LOCAL_SIZE, or else one process per visible GPU.
    # (placement.py imports no TensorFlow: the launcher's placement is what is checked.)
    common = base_env(DMLC_ROLE="worker", DMLC_NUM_WORKER=1, DMLC_NUM_SERVER=1,
                      DMLC_PS_ROOT_URI="127.0.0.1", **placement)
    common["DMLC_PS_ROOT_PORT"] = str(free_port())
    scheduler = procs.start(LAUNCH, {**common, "DMLC_ROLE": "scheduler"})
    server = procs.start(LAUNCH, {**common, "DMLC_ROLE": "server"})
    workers = procs.start([*LAUNCH, *worker_command("placement.py")], common)
    status, output = finish(workers, timeout=90)
    assert status == 0, output
    got = reports(output)
    assert sorted(got) == [0, 1] and all(r["size"] == 2 for r in got.values()), output
    assert all(r["sum"] == [2.0] * 4 for r in got.values()), output
    assert output.count("[0]: REPORT") == 1 and output.count("[1]: REPORT") == 1
    assert finish(scheduler, 20)[0] == 0 and finish(server, 20)[0] == 0


# A server that registers and vanishes before serving: it never listens on the port it
# gave, and sends no heartbeat.
VANISHING_SERVER = """
import os
from tf_bps.runtime.config import Config
from tf_bps.runtime.rendezvous import SchedulerLink
link = SchedulerLink(Config.from_env())
link.register("server", port=int(os.environ["TEST_DEAD_PORT"]))
os._exit(0)
"""


def test_an_abort_stops_workers_that_are_still_connecting(procs):
    # The workers would retry the vanished server for BYTEPS_OP_TIMEOUT (300 s); the
    # scheduler's abort, PS_HEARTBEAT_TIMEOUT after it went silent, must stop them.
    common = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(), DMLC_NUM_WORKER=2,
                  DMLC_NUM_SERVER=2, PS_HEARTBEAT_TIMEOUT=3, BYTEPS_JOB_TOKEN="the job's secret",
                  TEST_DEAD_PORT=free_port())
    procs.start(LAUNCH, base_env(DMLC_ROLE="scheduler", **common))
    procs.start(LAUNCH, base_env(DMLC_ROLE="server", **common))
    procs.start([sys.executable, "-c", VANISHING_SERVER], base_env(DMLC_ROLE="server", **common))
    workers = [procs.start([*LAUNCH, *worker_command("steady_sums.py")],
                           base_env(DMLC_ROLE="worker", DMLC_WORKER_ID=rank, **common))
               for rank in range(2)]
    started = time.monotonic()
    for worker in workers:
        status, output = finish(worker, timeout=60)
        assert status != 0 and "sent no heartbeat" in output, output
        assert "READY" not in output, output
    assert time.monotonic() - started < 30


def test_workers_under_gdb_print_a_backtrace_when_they_crash(procs):
    env = base_env(DMLC_ROLE="worker", BYTEPS_ENABLE_GDB=1)
    crash = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]
    status, output = procs.run([*LAUNCH, *crash], env, timeout=120)
    assert status != 0 and "SIGSEGV" in output and "\n#0 " in output, output
    # A worker that does not crash keeps its exit status.
    status, output = procs.run([*LAUNCH, sys.executable, "-c", "import sys; sys.exit(7)"], env,
                               timeout=120)
    assert status == 7, output


def test_a_sampled_tensor_is_logged_at_each_stage(procs):
    # Merged although the server is on the workers' host, for the merge's stage too.
    status, output = procs.launch(2, "steady_sums.py", num_servers=1, TEST_ROUNDS=2,
                                  BYTEPS_DEBUG_SAMPLE_TENSOR="steady", BYTEPS_LOCAL_MERGE=1)
    assert status == 0, output
    samples = re.findall(r"\[(\d)\]: .*sample of tensor 'steady' \(id \d+\) round (\d), "
                         r"([a-z0-9 ]+): first \[[^]]*\] sum (\d+) of 50000 elements", output)
    got = {(int(rank), int(step), stage, int(total)) for rank, step, stage, total in samples}
    for rank in (0, 1):  # What each pushed (rank + round - 1), and the sums both got.
        assert {(rank, 1, "pushed", rank * 50000), (rank, 2, "pushed", (rank + 1) * 50000),
                (rank, 1, "result", 50000), (rank, 2, "result", 150000)} <= got, output
    # The partition's leader logs the host's sum before it goes to the server.
    assert {(step, total) for _, step, stage, total in got if stage.startswith("host sum")} == \
        {(1, 50000), (2, 150000)}, output
