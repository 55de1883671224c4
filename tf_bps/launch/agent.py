"""A host's share of a bpslaunch job, started by the launcher over ssh (remote.py).

    python -m tf_bps.launch.agent HOST [--linger S]   (the plan arrives on standard input)

It runs the processes of the plan under a JobSupervisor, so their output is prefixed
and the first failure ends them all, and ends them too when its standard input closes:
the launcher is gone or has ended the job. With --linger, they get S seconds to finish
by themselves first (a worker that started its job's scheduler, cluster.py, exits
before the other workers have said goodbye to it).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from tf_bps.launch.remote import MAX_PLAN_BYTES, decode_plan
from tf_bps.launch.supervisor import JobSupervisor, LaunchError, supervise


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tf_bps.launch.agent")
    parser.add_argument("host", help="where it runs, for its messages")
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args(argv)
    name = f"bpslaunch on {args.host}"
    line = sys.stdin.buffer.readline(MAX_PLAN_BYTES)
    try:
        if not line.endswith(b"\n"):
            raise ValueError("no complete plan arrived")
        plan = decode_plan(line)
    except (ValueError, TypeError) as error:
        print(f"{name}: {error}", file=sys.stderr, flush=True)
        return 2
    supervisor = JobSupervisor(name)
    try:
        supervisor.start_host(plan, dict(os.environ))
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
