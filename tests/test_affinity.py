"""Core affinity of the workers a launcher starts (tf_bps/launch/affinity.py): the
placement rules on made-up hosts, then real workers reading their own affinity."""

import json
import os
import sys

import pytest
from harness import LAUNCH, base_env

from tf_bps.launch.affinity import Topology, plan_cores
from tf_bps.runtime.config import Config, ConfigError

# Two NUMA nodes of four physical cores, each with two hyperthreads (i and i + 8).
TWO_NODES = Topology(cores=tuple((i, i + 8) for i in range(8)),
                     nodes=(0, 0, 0, 0, 1, 1, 1, 1))


def _plan(local_size, gpu_nodes=None, **env):
    config = Config.from_env({k: str(v) for k, v in env.items()})
    return plan_cores(config, local_size, TWO_NODES, gpu_nodes)


def test_workers_get_their_gpus_node_and_never_share_a_core():
    # GPU 0 on node 1, GPU 1 on node 0: worker 0 gets node 1's cores with their siblings.
    assert _plan(2, [1, 0]) == [frozenset({4, 5, 6, 7, 12, 13, 14, 15}),
                                frozenset({0, 1, 2, 3, 8, 9, 10, 11})]
    # Without GPUs, workers are spread over the nodes in order; a quota of 1 core each.
    assert _plan(2, BYTEPS_NUMA_DEFAULT_QUOTA=1) == [frozenset({0, 8}), frozenset({4, 12})]
    # Hyperthreading off: one logical CPU per physical core.
    assert _plan(4, BYTEPS_MULTITHREADED_CPU=0) == [
        frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5}), frozenset({6, 7})]
    # Blacklisted CPUs are avoided; a core with one thread left keeps that one.
    plan = _plan(2, BYTEPS_CPU_BLACKLIST="0-2,12", BYTEPS_NUMA_DEFAULT_QUOTA=2)
    assert plan == [frozenset({8, 9}), frozenset({4, 5, 13})]
    # A node too small for its worker's quota lends cores from the other.
    assert _plan(2, [0, 0], BYTEPS_NUMA_DEFAULT_QUOTA=3)[1] == frozenset({3, 11, 4, 12, 5, 13})


def test_explicit_lists_and_what_turns_pinning_off():
    assert _plan(2, BYTEPS_VISIBLE_CPU_CORES="1,4-5:6") == [frozenset({1, 4, 5}),
                                                            frozenset({6})]
    assert _plan(2, BYTEPS_NUMA_ON=0) is None
    assert _plan(9) is None  # Fewer physical cores than workers: nothing to divide.
    with pytest.raises(ConfigError, match="need 18 physical cores and 8 are usable"):
        _plan(2, BYTEPS_NUMA_DEFAULT_QUOTA=9)
    with pytest.raises(ConfigError, match="has 1 section.*runs 2 worker"):
        _plan(2, BYTEPS_VISIBLE_CPU_CORES="0-3")


AFFINITY = "import json, os; print('CORES', json.dumps(sorted(os.sched_getaffinity(0))))"


def _worker_cores(procs, **env):
    """Starts 2 local workers through bpslaunch; each one's CPUs, by local rank."""
    status, output = procs.run([*LAUNCH, sys.executable, "-c", AFFINITY],
                               base_env(DMLC_ROLE="worker", BYTEPS_LOCAL_SIZE=2, **env),
                               timeout=60)
    assert status == 0, output
    return {int(line[1]): set(json.loads(line.split("CORES ", 1)[1]))
            for line in output.splitlines() if "CORES " in line}


def test_launched_workers_run_on_their_cores(procs):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    first, second = sorted(os.sched_getaffinity(0))[:2]
    assert _worker_cores(procs, BYTEPS_VISIBLE_CPU_CORES=f"{second}:{first}") == {
        0: {second}, 1: {first}}
    automatic = _worker_cores(procs)
    assert automatic[0] and automatic[1] and not automatic[0] & automatic[1], automatic
    everywhere = set(os.sched_getaffinity(0))
    assert _worker_cores(procs, BYTEPS_NUMA_ON=0) == {0: everywhere, 1: everywhere}


def test_malformed_core_lists_name_the_variable_and_the_part(procs):
    for env, message in [
        ({"BYTEPS_VISIBLE_CPU_CORES": "0:x"},
         "BYTEPS_VISIBLE_CPU_CORES='0:x' is not valid: 'x' is not a CPU number or range"),
        ({"BYTEPS_CPU_BLACKLIST": "3-1"}, "BYTEPS_CPU_BLACKLIST='3-1' is not valid: '3-1'"),
        ({"BYTEPS_VISIBLE_CPU_CORES": "0:4095"}, "names CPU 4095, which this host does not"),
    ]:
        status, output = procs.run([*LAUNCH, sys.executable, "-c", AFFINITY],
                                   base_env(DMLC_ROLE="worker", BYTEPS_LOCAL_SIZE=2, **env),
                                   timeout=60)
        assert status != 0 and message in output, (env, output)
