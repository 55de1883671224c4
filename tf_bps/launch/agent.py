"""A host's share of a bpslaunch job, started by the launcher over ssh (remote.py).

    python -m tf_bps.launch.agent HOST [--linger S]   (the plan arrives on standard input)
    python -m tf_bps.launch.agent MANAGER --cluster-helpers [--linger S]

It runs the processes of the plan under a JobSupervisor, so their output is prefixed
and the first failure ends them all, and ends them too when its standard input closes:
the launcher is gone or has ended the job. With --linger, they get S seconds to finish
by themselves first.

With --cluster-helpers, the plan is the scheduler and/or server that a cluster
manager's placement (mpirun, srun, TF_CONFIG; runtime/cluster_env.py) asks of the
worker that started the agent from bps.init(); that worker holds the agent's standard
input, and lingering lets the other workers say goodbye to a scheduler whose worker
finished first.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from tf_bps.launch.remote import MAX_PLAN_BYTES, decode_plan
from tf_bps.launch.supervisor import (
    JobSupervisor,
    LaunchError,
    ProcessPlan,
    helper_plan,
    supervise,
)
from tf_bps.runtime.cluster_env import ClusterError, placement
from tf_bps.runtime.config import environment


def cluster_helper_plans() -> list[ProcessPlan]:
    """The scheduler and/or server this process's placement asks for."""
    env = environment()
    found = placement(env)
    if found is None:
        raise ValueError("no cluster manager placed this process")
    job = {**found.variables, **{k: v for k, v in env.items() if k.startswith("DMLC_")}}
    plans = []
    if found.starts_scheduler:
        plans.append(helper_plan("scheduler", "scheduler", job))
    if found.starts_server:
        plans.append(helper_plan("server", "server", job))
    return plans


def read_plan() -> list[ProcessPlan]:
    """The plan the launcher sends over ssh: one line of standard input."""
    line = sys.stdin.buffer.readline(MAX_PLAN_BYTES)
    if not line.endswith(b"\n"):
        raise ValueError("no complete plan arrived")
    return decode_plan(line)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tf_bps.launch.agent")
    parser.add_argument("host", help="where it runs, for its messages")
    parser.add_argument("--linger", type=float, default=0.0)
    parser.add_argument("--cluster-helpers", action="store_true",
                        help="run the helpers this process's placement asks for")
    args = parser.parse_args(argv)
    name = f"bpslaunch on {args.host}"
    try:
        plan = cluster_helper_plans() if args.cluster_helpers else read_plan()
    except (ValueError, TypeError, ClusterError) as error:
        print(f"{name}: {error}", file=sys.stderr, flush=True)
        return 2
    supervisor = JobSupervisor(name)
    try:
        supervisor.start_host(plan, environment())
    except LaunchError as error:
        supervisor.report(str(error))
        return 127

    def watch_launcher() -> None:
        # os.read, not sys.stdin: a thread blocked in a buffered read would stop the
        # interpreter from shutting down.
        while os.read(0, 4096):
            pass
        time.sleep(args.linger)
        supervisor.stop("the launcher ended the job or was lost")

    threading.Thread(target=watch_launcher, daemon=True).start()
    return supervise(supervisor)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
