"""bpslaunch: starts one role of a job (with DMLC_ROLE), or a whole job on this machine
or across hosts.

    DMLC_ROLE=scheduler bpslaunch
    DMLC_ROLE=server bpslaunch
    DMLC_ROLE=worker DMLC_WORKER_ID=0 ... bpslaunch python train.py
    bpslaunch -np 2 [--num-servers 2] python train.py
    bpslaunch -np 8 -H node1:4,node2:4 [--server-hosts cpu1,cpu2] python train.py
    bpslaunch -np 4 --min-np 2 [--max-np 8] python train.py   (elastic: see tf_bps.elastic)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import secrets
import shutil
import socket
import sys
import threading

import tf_bps
from tf_bps.launch import build_check, remote
from tf_bps.launch.discovery import DiscoveryError
from tf_bps.launch.elastic_driver import ElasticDriver, ElasticSettings
from tf_bps.launch.hosts import Host, HostError, Layout, parse_hosts, plan_layout, read_hostfile
from tf_bps.launch.metrics_ports import MetricsPorts
from tf_bps.launch.output import JobOutput
from tf_bps.launch.remote import SshOptions
from tf_bps.launch.supervisor import (
    JobSupervisor,
    LaunchError,
    ProcessPlan,
    helper_plan,
    supervise,
)
from tf_bps.runtime.config import LOG_LEVELS, Config, ConfigError, environment


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def _port_on(is_local: bool) -> int:
    """A port for a listener on a host: a free one here; elsewhere, where nothing can be
    asked, a random one (a clash fails that listener with a clear error)."""
    return _free_port() if is_local else random.randrange(20000, 60000)


def _horovod_variables(rank: int, size: int, local_rank: int, local_size: int) -> dict:
    """What horovodrun tells each process, for scripts and tests that read it."""
    return {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size)}


def elastic_variables(args: argparse.Namespace) -> dict[str, str]:
    """What the elastic options (Horovod's) tell the job; none without --min-np or
    --max-np."""
    if args.min_np is None and args.max_np is None and not args.host_discovery_script:
        for flag, value in (("--elastic-timeout", args.elastic_timeout),
                            ("--reset-limit", args.reset_limit),
                            ("--slots-per-host", args.slots_per_host),
                            ("--blacklist-cooldown-range", args.blacklist_cooldown_range)):
            if value is not None:
                raise HostError(f"{flag} is for elastic jobs: give --min-np (and --max-np) "
                                "or --host-discovery-script")
        return {}
    if args.host_discovery_script and (args.hosts or args.hostfile or args.server_hosts):
        raise HostError("--host-discovery-script lists the worker hosts: give no -H, "
                        "--hostfile or --server-hosts (the scheduler and servers run here)")
    low, high = args.min_np or 1, args.max_np
    if low < 1 or (high is not None and high < low) or \
            (args.num_workers is not None and not low <= args.num_workers <= (high or 4096)):
        raise HostError(f"elastic sizes must satisfy 1 <= --min-np ({low}) <= -np "
                        f"({args.num_workers}) <= --max-np ({high})")
    job = {"BYTEPS_ELASTIC": "1", "BYTEPS_ELASTIC_MIN_WORKERS": str(low)}
    if high is not None:
        job["BYTEPS_ELASTIC_MAX_WORKERS"] = str(high)
    if args.elastic_timeout is not None:
        job["BYTEPS_ELASTIC_TIMEOUT"] = str(args.elastic_timeout)
    if args.reset_limit is not None:
        job["BYTEPS_ELASTIC_RESET_LIMIT"] = str(args.reset_limit)
    return job


def _plan_processes(layout: Layout, command: list[str], base: dict[str, str],
                    local: dict[str, bool], interface: str | None,
                    elastic: dict[str, str]) -> dict[str, list]:
    """The processes of each host, with the variables that place them in the job."""
    config = Config.from_env({**base, **elastic})
    single = layout.num_workers == 1 and not config.force_distributed and not elastic
    scheduler_host = layout.hosts[0].name
    job = {"DMLC_NUM_WORKER": str(layout.num_worker_hosts),
           "BYTEPS_LOCAL_SIZE": str(layout.local_size), **elastic}
    if interface:
        job["DMLC_INTERFACE"] = interface
    if not single:
        every_host_local = all(local.values())
        if not every_host_local and scheduler_host == "localhost":
            raise LaunchError("name this machine in -H by a name or address the other hosts "
                              "can reach, not 'localhost'")
        port = base.get("DMLC_PS_ROOT_PORT") or str(_port_on(local[scheduler_host]))
        # One token for every process of this job, unless the user brought one.
        job.update(BYTEPS_JOB_TOKEN=base.get("BYTEPS_JOB_TOKEN") or secrets.token_hex(16),
                   DMLC_PS_ROOT_URI="127.0.0.1" if every_host_local else scheduler_host,
                   DMLC_PS_ROOT_PORT=port, DMLC_NUM_SERVER=str(layout.num_servers))
    python = sys.executable
    # TF_CONFIG as TensorFlow's multi-worker recipes read it (the worker count, this
    # worker's index), unless the user set one.
    tf_cluster = {"worker": [
        f"{'127.0.0.1' if local[h.name] else h.name}:{_port_on(local[h.name])}"
        for h in layout.hosts if h.has_workers for _ in range(layout.local_size)]}
    plans: dict[str, list[ProcessPlan]] = {}
    server_index = itertools.count()
    for host in layout.hosts:
        processes = plans.setdefault(host.name, [])
        if host.scheduler and not single:
            processes.append(helper_plan("scheduler", "scheduler", job, python))
        for _ in range(0 if single else host.servers):
            processes.append(helper_plan("server", f"server {next(server_index)}", job, python))
        for local_rank in range(host.workers):
            rank = host.worker_id * layout.local_size + local_rank
            env = {**job, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(host.worker_id),
                   "BYTEPS_LOCAL_RANK": str(local_rank),
                   **_horovod_variables(rank, layout.num_workers, local_rank,
                                        layout.local_size)}
            if "TF_CONFIG" not in base and layout.num_workers > 1:
                env["TF_CONFIG"] = json.dumps({"cluster": tf_cluster,
                                               "task": {"type": "worker", "index": rank}})
            processes.append(ProcessPlan(f"worker {rank}", command, env, is_worker=True,
                                         prefix=f"[{rank}]: "))
    ports = MetricsPorts(base)
    for host, processes in plans.items():
        for process in processes:
            ports.assign("this machine" if local[host] else host, process.env)
    return plans


def _launch_job(layout: Layout, command: list[str], ssh: SshOptions,
                interface: str | None, elastic: dict[str, str], output: JobOutput) -> int:
    base = environment()
    try:
        local = {host.name: remote.is_this_machine(host.name) for host in layout.hosts}
    except ValueError as error:
        raise LaunchError(str(error)) from None
    plans = _plan_processes(layout, command, base, local, interface, elastic)
    for process in itertools.chain(*plans.values()):
        process.hide_tf_notices = process.is_worker and output.hide_tf_notices
    supervisor = JobSupervisor(elastic=bool(elastic), output=output)
    forwarded = remote.forwarded_environment(base)
    for host, processes in plans.items():
        if local[host]:
            supervisor.start_host(processes, base)
        elif processes:
            for process in processes:
                process.env = {**forwarded, **process.env}
            supervisor.start(f"host {host}", remote.agent_command(host, ssh), base,
                             is_worker=any(p.is_worker for p in processes),
                             stdin=remote.encode_plan(processes))
    return supervise(supervisor)


def _launch_discovered(args: argparse.Namespace, ssh: SshOptions, elastic: dict[str, str],
                       output: JobOutput) -> int:
    """An elastic job on the hosts a discovery script lists (elastic_driver.py): the
    scheduler and servers here, workers wherever the script says, as it says."""
    base = environment()
    settings = ElasticSettings(
        script=args.host_discovery_script, default_slots=args.slots_per_host or 1,
        initial=args.num_workers or args.min_np or 1, min_np=args.min_np or 1,
        max_np=args.max_np, timeout=Config.from_env({**base, **elastic}).elastic_timeout,
        cooldown=tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None)
    supervisor = JobSupervisor(elastic=True, output=output)
    job = {**elastic, "BYTEPS_LOCAL_SIZE": "1",
           "BYTEPS_JOB_TOKEN": base.get("BYTEPS_JOB_TOKEN") or secrets.token_hex(16),
           "DMLC_NUM_SERVER": str(args.num_servers or 1),
           "DMLC_PS_ROOT_PORT": base.get("DMLC_PS_ROOT_PORT") or str(_free_port())}
    if args.network_interface:
        job["DMLC_INTERFACE"] = args.network_interface

    ports = MetricsPorts(base)

    def worker_plan(host: str, index: int, local: bool) -> ProcessPlan:
        # The first generation numbers its workers by DMLC_WORKER_ID; later ones by
        # their order of arrival, whatever their id.
        env = {**job, "DMLC_ROLE": "worker", "HOROVOD_HOSTNAME": host,
               "BYTEPS_ELASTIC_WORKER_NAME": f"{host}#{index}",
               "DMLC_WORKER_ID": str(index if index < int(job["DMLC_NUM_WORKER"]) else 0)}
        ports.assign("this machine" if local else host, env)
        return ProcessPlan(f"worker {index} on {host}", args.command, env, is_worker=True,
                           prefix=f"[{host}#{index}]: ", hide_tf_notices=output.hide_tf_notices)

    driver = ElasticDriver(supervisor, settings, worker_plan, ssh, base, job)
    try:
        hosts = driver.first_hosts()
        every_host_local = all(remote.is_this_machine(host.name) for host in hosts)
    except (DiscoveryError, ValueError) as error:
        raise LaunchError(str(error)) from None
    slots = sum(host.slots for host in hosts)
    job["DMLC_NUM_WORKER"] = str(min(slots, args.max_np or slots))
    job["DMLC_PS_ROOT_URI"] = ("127.0.0.1" if every_host_local else
                               base.get("DMLC_NODE_HOST") or socket.gethostname())
    helpers = [helper_plan("scheduler", "scheduler", job)]
    helpers += [helper_plan("server", f"server {i}", job) for i in range(args.num_servers or 1)]
    for helper in helpers:
        ports.assign("this machine", helper.env)
    supervisor.start_host(helpers, base)
    driver.start_workers(hosts)
    polling = threading.Thread(target=driver.run, name="host-discovery", daemon=True)
    polling.start()
    try:
        return supervise(supervisor)
    finally:
        driver.stop()


def _launch_local_ranks(config: Config, command: list[str], output: JobOutput) -> int:
    """DMLC_ROLE=worker with BYTEPS_LOCAL_SIZE > 1, or several visible GPUs: one process
    per local rank (each uses the GPU of its local rank, see basics._pin_gpu)."""
    processes = []
    for local_rank in range(config.local_size):
        rank = config.worker_id * config.local_size + local_rank
        env = {"BYTEPS_LOCAL_RANK": str(local_rank), "BYTEPS_LOCAL_SIZE": str(config.local_size),
               **_horovod_variables(rank, config.size, local_rank, config.local_size)}
        processes.append(ProcessPlan(f"worker {rank}", command, env, is_worker=True,
                                     prefix=f"[{rank}]: ",
                                     hide_tf_notices=output.hide_tf_notices))
    supervisor = JobSupervisor(output=output)
    supervisor.start_host(processes, environment())
    return supervise(supervisor)


def job_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options that describe a whole job (bpslaunch's and perseusrun's)."""
    parser.add_argument("-v", "--version", action="version",
                        version=f"%(prog)s (tf_bps) {tf_bps.__version__}")
    parser.add_argument("-np", "--num-proc", "--num-workers", type=int, dest="num_workers",
                        help="worker processes (default with -H: every slot)")
    parser.add_argument("-H", "--hosts", help="worker hosts and their slots: host1:4,host2:4 "
                        "(the scheduler runs on the first)")
    parser.add_argument("--hostfile", help="worker hosts, one per line: `host slots=N`")
    parser.add_argument("--num-servers", type=int,
                        help="servers (default: one per worker on this machine, one per "
                             "worker host with -H, or the slots of --server-hosts)")
    parser.add_argument("--server-hosts", help="hosts for the servers (host or host:N, comma "
                        "separated), e.g. CPU-only machines; default: the worker hosts")
    parser.add_argument("--network-interface", help="the interface every process advertises "
                        "(sets DMLC_INTERFACE)")
    parser.add_argument("-p", "--ssh-port", type=int, help="the port of sshd on the hosts")
    parser.add_argument("-i", "--ssh-identity-file", help="the private key ssh uses")
    parser.add_argument("--ssh-command", default="ssh",
                        help="the ssh client and any options of yours (default: ssh)")
    elastic = parser.add_argument_group(
        "elastic training", "Horovod's options: the job re-forms when a worker is lost or "
        "joins (train inside tf_bps.elastic.run)")
    elastic.add_argument("--min-np", type=int, help="the fewest workers the job goes on with")
    elastic.add_argument("--max-np", type=int, help="the most workers the job takes in")
    elastic.add_argument("--elastic-timeout", type=float, help="seconds a re-forming may wait "
                         "for enough workers (default 600)")
    elastic.add_argument("--reset-limit", type=int,
                         help="how many times the job may re-form (default: no limit)")
    elastic.add_argument("--host-discovery-script",
                         help="a command printing the worker hosts, `host:slots` a line; run "
                              "every second (the scheduler and servers run on this machine)")
    elastic.add_argument("--slots-per-host", type=int,
                         help="slots of a host the discovery script lists without a number")
    elastic.add_argument("--blacklist-cooldown-range", type=float, nargs=2,
                         metavar=("LOW", "HIGH"),
                         help="seconds a host whose worker failed stays out, drawn from this "
                              "range (default: for good)")
    _output_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the worker's command (may follow a `--`)")
    return parser


def _output_arguments(parser: argparse.ArgumentParser) -> None:
    """horovodrun's options for what a job prints, logs and records."""
    group = parser.add_argument_group("output, logs and checks", "horovodrun's options")
    group.add_argument("--start-timeout", type=float, metavar="SECONDS",
                       help="every node must have joined within this many seconds of "
                            "starting (sets HOROVOD_START_TIMEOUT; default "
                            "BYTEPS_OP_TIMEOUT)")
    group.add_argument("--verbose", action="store_true",
                       help="more messages: tf_bps logs at INFO unless --log-level says "
                            "otherwise, and TensorFlow's start-up notices are shown")
    group.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                       help="tf_bps's log level in every process (sets BYTEPS_LOG_LEVEL)")
    group.add_argument("--output-filename", metavar="DIR",
                       help="also keep each process's output in DIR/rank.<rank>/stdout and "
                            "stderr (DIR/scheduler, DIR/server.<i> for the others)")
    group.add_argument("--prefix-output-with-timestamp", action="store_true",
                       help="start every line of the job's output with the time")
    group.add_argument("--timeline-filename", metavar="FILE",
                       help="rank 0 records its timeline into FILE (sets HOROVOD_TIMELINE; "
                            "steps BYTEPS_TRACE_START_STEP to BYTEPS_TRACE_END_STEP)")
    group.add_argument("--check-build", action="store_true",
                       help="show what this installation of tf_bps can do, and exit")


def flag_variables(args: argparse.Namespace) -> dict[str, str]:
    """The variables the output options set for every process of the job."""
    variables = {}
    if args.start_timeout is not None:
        variables["HOROVOD_START_TIMEOUT"] = f"{args.start_timeout:g}"
    if args.log_level or args.verbose:
        variables["BYTEPS_LOG_LEVEL"] = args.log_level or "INFO"
    if args.timeline_filename:
        variables["HOROVOD_TIMELINE"] = os.path.abspath(args.timeline_filename)
    return variables


def _layout(args) -> Layout:
    if args.hosts and args.hostfile:
        raise HostError("give -H or --hostfile, not both")
    if args.hosts:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile:
        hosts = read_hostfile(args.hostfile)
    else:
        if args.num_workers is None or args.num_workers < 1:
            raise HostError("set DMLC_ROLE (scheduler, server or worker), or give -np N to "
                            "start a whole job on this machine (-H host:N,... across hosts)")
        hosts = [Host("localhost", args.num_workers)]
    server_hosts = parse_hosts(args.server_hosts, "--server-hosts") if args.server_hosts else None
    num_servers = args.num_servers
    if num_servers is None and not args.hosts and not args.hostfile and not server_hosts:
        num_servers = args.num_workers  # One per worker on this machine.
    return plan_layout(hosts, args.num_workers, num_servers, server_hosts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bpslaunch",
        description="Start a tf_bps job. With DMLC_ROLE set, run that one role; without it, "
                    "start a scheduler, servers and -np workers on this machine, or on the "
                    "hosts of -H/--hostfile over ssh.")
    return run(job_arguments(parser).parse_args(argv))


def run(args: argparse.Namespace, whole_job: bool = False) -> int:
    """Runs what parsed `args` ask for; `whole_job`: start a whole job even when
    DMLC_ROLE is set (perseusrun)."""
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.check_build:
        return build_check.report()
    os.environ.update(flag_variables(args))
    try:
        config = Config.from_env()
    except ConfigError as error:
        print(f"bpslaunch: {error}", file=sys.stderr)
        return 2
    # Asking for a layout (-np, -H) starts a whole job, even where a cluster manager's
    # variables would make this process one role of a job.
    whole_job = whole_job or any((args.num_workers, args.hosts, args.hostfile))
    role = None if whole_job else config.role
    if role == "scheduler":
        from tf_bps.control import scheduler

        return scheduler.main()
    if role == "server":
        from tf_bps.control import server

        return server.main()
    if role is None:
        try:
            elastic = elastic_variables(args)
            layout = None if args.host_discovery_script else _layout(args)
        except HostError as error:
            print(f"bpslaunch: {error}", file=sys.stderr)
            return 2
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
    # TensorFlow's start-up notices: hidden unless asked for (output.py).
    asked = args.verbose or "TF_CPP_MIN_LOG_LEVEL" in os.environ
    output = JobOutput(args.output_filename, args.prefix_output_with_timestamp,
                       hide_tf_notices=not asked)
    if role == "worker":
        if config.local_size > 1 and "BYTEPS_LOCAL_RANK" not in environment():
            return _run(_launch_local_ranks, config, args.command, output)
        os.execvp(args.command[0], args.command)
    ssh = SshOptions(args.ssh_command, args.ssh_port, args.ssh_identity_file)
    if layout is None:
        return _run(_launch_discovered, args, ssh, elastic, output)
    return _run(_launch_job, layout, args.command, ssh, args.network_interface, elastic,
                output)


def _run(launch, *args) -> int:
    try:
        return launch(*args)
    except LaunchError as error:
        print(f"bpslaunch: {error}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
