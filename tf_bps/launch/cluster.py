"""Starting the helper processes (scheduler, server) that a cluster manager's placement
asks of a process with no bpslaunch (cluster_env.py reads the placement)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from tf_bps.cluster_env import Placement
from tf_bps.launch.remote import encode_plan
from tf_bps.launch.supervisor import ProcessPlan


def start_helpers(found: Placement, env: Mapping[str, str]) -> subprocess.Popen | None:
    """Starts the scheduler and/or server `found` asks this process for, under an agent
    (agent.py) that ends them once this process is gone and they had time to finish
    the job. The caller keeps the returned process (its stdin) for its lifetime."""
    plans = []
    job = {**found.variables, **{k: v for k, v in env.items() if k.startswith("DMLC_")}}
    if found.starts_scheduler:
        plans.append(ProcessPlan("scheduler", [sys.executable, "-m", "tf_bps.scheduler"],
                                 {**job, "DMLC_ROLE": "scheduler"}, is_worker=False))
    if found.starts_server:
        plans.append(ProcessPlan("server", [sys.executable, "-m", "tf_bps.server"],
                                 {**job, "DMLC_ROLE": "server"}, is_worker=False))
    if not plans:
        return None
    agent = subprocess.Popen([sys.executable, "-m", "tf_bps.launch.agent", found.manager,
                              "--linger", "30"], stdin=subprocess.PIPE,
                             env=dict(os.environ), start_new_session=True)
    agent.stdin.write(encode_plan(plans))
    agent.stdin.flush()
    return agent
