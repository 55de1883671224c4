"""A summation server: `bps-server`, `DMLC_ROLE=server bpslaunch` or
`DMLC_ROLE=server python -m tf_bps.control.server`.

The server is a native program (custom_ops/server/main.cc, built as tf_bps/bps_server):
this entry point only replaces itself with it, adding the variables a cluster manager's
placement implies (cluster_env.py), so the server process holds no Python at all.
"""

from __future__ import annotations

import os
import sys

from tf_bps.runtime.cluster_env import ClusterError, placement
from tf_bps.runtime.core import NotBuiltError, server_executable


def main() -> int:
    try:
        executable = server_executable()
        cluster = placement(os.environ)
    except (NotBuiltError, ClusterError) as error:
        print(f"tf_bps server: {error}", file=sys.stderr)
        return 2
    env = os.environ if cluster is None else {**cluster.variables, **os.environ}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(executable, [str(executable)], env)
    except OSError as error:  # Not executable, say: otherwise execve does not return.
        print(f"tf_bps server: cannot run {executable}: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
