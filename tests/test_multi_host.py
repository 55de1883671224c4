"""bpslaunch -H across hosts made of network namespaces (tests/netbed.py), each with a
real sshd: the launcher runs on the first host and reaches the others over ssh, as on a
cluster. Skipped without root or openssh-server."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from harness import LAUNCH, base_env, finish, worker_command
from netbed import NetBed, NetBedUnavailable, SshHosts
from test_collectives import check_collectives


@pytest.fixture
def hosts(tmp_path):
    try:
        with NetBed(hosts=3, mbit=1000) as bed, SshHosts(bed, str(tmp_path)) as ssh:
            yield bed, ssh
            _assert_nothing_left(bed, ssh)
    except NetBedUnavailable as error:
        pytest.skip(str(error))


def _assert_nothing_left(bed: NetBed, ssh: SshHosts) -> None:
    """Only the test's sshd (and the session processes it is ending) run on the hosts."""
    deadline = time.monotonic() + 15
    while True:
        left = {}
        for host in range(bed.hosts):
            listing = subprocess.run(["ip", "netns", "pids", bed.namespace(host)],
                                     capture_output=True, text=True).stdout.split()
            for pid in map(int, listing):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                        command = cmdline.read().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if pid not in ssh.daemon_pids() and "sshd" not in command:
                    left[pid] = command
        if not left:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"processes left on the hosts: {left}")
        time.sleep(0.5)


def _bpslaunch(bed, ssh, *args):
    """bpslaunch run on host 0 (its first argument list ends with the worker command)."""
    return bed.command(0, [*LAUNCH, *ssh.ssh_options(), *args])


def test_a_job_runs_across_hosts_over_ssh(procs, hosts, tmp_path):
    bed, ssh = hosts
    # Two worker hosts of two workers each (one local to the launcher, one over ssh), and
    # a host of servers only, as with BytePS's CPU-only server machines; horovodrun's
    # short ssh flags, and each rank's output kept by the launcher, wherever it ran.
    command = bed.command(0, [*LAUNCH, *ssh.ssh_options(short=True), "-H",
                              f"{bed.address(0)}:2,{bed.address(1)}:2", "--server-hosts",
                              bed.address(2), "--num-servers", "2", "--output-filename",
                              str(tmp_path / "out"), *worker_command("steady_sums.py")])
    status, output = procs.run(command, base_env(TEST_ROUNDS=5), timeout=180)
    assert status == 0, output
    for rank in range(4):
        assert f"[{rank}]: SUMS OK {rank}" in output, output
        kept = (tmp_path / "out" / f"rank.{rank}" / "stdout").read_text().splitlines()
        assert kept[-1] == f"SUMS OK {rank}", kept


def test_the_hybrid_layout_gives_server_only_hosts_the_papers_share(procs, hosts):
    bed, ssh = hosts
    # BytePS's hybrid layout: a server on each of the two worker hosts and one on a host
    # of its own (n = 2, k = 1). The paper's split gives the server-only host half of
    # the traffic and each worker host's server a quarter.
    workers = f"{bed.address(0)}:1,{bed.address(1)}:1"
    servers = ",".join(bed.address(host) for host in range(3))
    command = _bpslaunch(bed, ssh, "-H", workers, "--server-hosts", servers,
                         *worker_command("steady_sums.py"))
    status, output = procs.run(command, base_env(TEST_ROUNDS=3, TEST_ELEMENTS=1 << 20,
                                                 BYTEPS_LOG_LEVEL="DEBUG"), timeout=180)
    assert status == 0, output
    host_of = dict(re.findall(r"registered server (\d+) \(pid \d+ on (\S+)\)", output))
    moved = {host_of[server]: int(count) for server, count in re.findall(
        r"tf_bps server (\d+) on \S+ DEBUG\] tensor 'steady' moved (\d+) bytes in", output)}
    quarter = 3 * 2 * (4 << 20) // 4  # rounds x workers x bytes / 4
    assert moved == {bed.address(0): quarter, bed.address(1): quarter,
                     bed.address(2): 2 * quarter}, output


def test_every_collective_works_in_the_hybrid_layout(procs, hosts, tmp_path):
    # Uneven shares, and the push window that comes with them, under every operation.
    bed, ssh = hosts
    workers = f"{bed.address(0)}:1,{bed.address(1)}:1"
    servers = ",".join(bed.address(host) for host in range(3))
    command = _bpslaunch(bed, ssh, "-H", workers, "--server-hosts", servers,
                         *worker_command("collectives.py"))
    status, output = procs.run(command, base_env(TEST_OUT=str(tmp_path)), timeout=240)
    assert status == 0, output
    check_collectives(tmp_path, 2, local_size=1)


def test_a_failure_on_one_host_ends_the_job_on_every_host(procs, hosts):
    bed, ssh = hosts
    # Both worker hosts are remote; rank 1 (on host 2) fails, and the launcher must end
    # host 1's worker, server and scheduler through their ssh session.
    started = time.monotonic()
    command = _bpslaunch(bed, ssh, "-H", f"{bed.address(1)}:1,{bed.address(2)}:1",
                         *worker_command("exit_with.py", "7"))
    status, output = procs.run(command, base_env(), timeout=120)
    assert status == 7, output
    assert f"host {bed.address(2)} failed with status 7" in output, output
    assert "worker 1 failed with status 7" in output, output
    assert time.monotonic() - started < 50  # Rank 0 would sleep 60 s if left alone.


def test_a_launcher_that_is_stopped_leaves_nothing_running(procs, hosts):
    bed, ssh = hosts
    command = _bpslaunch(bed, ssh, "-H", f"{bed.address(1)}:1,{bed.address(2)}:1",
                         *worker_command("steady_sums.py"))
    launcher = procs.start(command, base_env(TEST_ROUNDS=100000))
    ready, lines = 0, []
    deadline = time.monotonic() + 90
    while ready < 2 and time.monotonic() < deadline:
        line = launcher.stdout.readline()
        lines.append(line)
        ready += "READY" in line
    assert ready == 2, "".join(lines)
    # `ip netns exec` runs bpslaunch itself in the launcher's process.
    os.kill(launcher.pid, signal.SIGTERM)
    status, output = finish(launcher, timeout=30)
    assert status == 128 + signal.SIGTERM, "".join(lines) + output


def test_bad_host_lists_are_refused_before_anything_starts(procs):
    cases = [
        (["-H", "a:2,b:1"], "every host must run the same number of workers"),
        (["-H", "a:0"], "the slots of 'a' must be a number from 1 to 4096"),
        (["-H", "a:2,a:2"], "a listed more than once"),
        (["-np", "5", "-H", "a:2,b:2"], "-np 5: the hosts have 4 slot(s)"),
        (["-H", "no-such-host.invalid:1,b:1"], "cannot resolve host 'no-such-host.invalid'"),
        (["--hostfile", "/nonexistent"], "--hostfile '/nonexistent': No such file"),
    ]
    for args, message in cases:
        status, output = procs.run([*LAUNCH, *args, sys.executable, "-c", "pass"], base_env(),
                                   timeout=30)
        assert status != 0 and message in output, (args, output)


def test_perseusrun_takes_the_aiacc_syntax_across_hosts(procs, hosts):
    bed, ssh = hosts
    # As the AIACC document writes it, dashes and all.
    perseusrun = [sys.executable, "-m", "tf_bps.launch.perseusrun"]
    command = bed.command(0, [*perseusrun, "\u2013-mpi", "\u2013np", "2", "\u2013H",
                              f"{bed.address(1)}:1,{bed.address(2)}:1", *ssh.ssh_options(),
                              "--", *worker_command("steady_sums.py")])
    status, output = procs.run(command, base_env(TEST_ROUNDS=3), timeout=120)
    assert status == 0, output
    assert "[0]: SUMS OK 0" in output and "[1]: SUMS OK 1" in output, output
    status, output = procs.run([*perseusrun, "-h"], base_env(), timeout=30)
    assert status == 0 and "--gloo" in output and "changes nothing" in output, output
