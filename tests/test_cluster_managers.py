"""Jobs started by cluster managers, with no bpslaunch: each process finds its place in
the job from the variables its manager sets (tf_bps/runtime/cluster_env.py). A real mpirun
(Debian's Open MPI) on this machine; Slurm's srun, Kubeflow's TF_CONFIG and a Kubernetes
Indexed Job as they set their variables, on hosts made of network namespaces
(tests/netbed.py); Volcano's variables as placements."""

import json
import re
import shutil
import time

import pytest
from harness import base_env, finish, worker_command
from netbed import NetBed, NetBedUnavailable

from tf_bps.runtime.cluster_env import ClusterError, expand_nodelist
from tf_bps.runtime.config import Config, ConfigError


@pytest.fixture
def bed():
    try:
        with NetBed(hosts=3) as made:
            yield made
    except NetBedUnavailable as error:
        pytest.skip(str(error))


def _all_succeed(started, timeout=150):
    outputs = []
    deadline = time.monotonic() + timeout
    for process in started:
        status, output = finish(process, timeout=max(1, deadline - time.monotonic()))
        assert status == 0, output
        outputs.append(output)
    return outputs


def test_mpirun_places_workers_and_starts_scheduler_and_server(procs):
    if not shutil.which("mpirun"):
        pytest.skip("mpirun is not installed (apt-get install openmpi-bin)")
    # Open MPI refuses root unless told; the test machine runs as root.
    env = base_env(TEST_ROUNDS=5, OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
    # --tag-output: mpirun passes each rank's lines whole, tagged [job,rank]<stdout>.
    command = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "--tag-output",
               *worker_command("steady_sums.py")]
    status, output = procs.run(command, env, timeout=150)
    assert status == 0, output
    assert ",0]<stdout>:SUMS OK 0" in output and ",1]<stdout>:SUMS OK 1" in output, output


def test_srun_variables_place_workers_across_hosts(procs, bed):
    # What srun sets for 2 tasks on 2 nodes; rank 0 starts the scheduler on the first
    # node of the list, and each node's first task a server.
    nodes = f"{bed.address(0).rsplit('.', 1)[0]}.[1-2]"
    started = []
    for rank in range(2):
        env = base_env(TEST_ROUNDS=5, SLURM_PROCID=rank, SLURM_NTASKS=2, SLURM_LOCALID=0,
                       SLURM_NODEID=rank, SLURM_NNODES=2, SLURM_NODELIST=nodes,
                       SLURM_JOB_ID=4242, SLURM_STEP_ID=0)
        started.append(procs.start(bed.command(rank, worker_command("steady_sums.py")), env))
    for rank, output in enumerate(_all_succeed(started)):
        assert f"SUMS OK {rank}" in output, output


def test_tf_config_chief_worker_and_ps_tasks(procs, bed):
    # Kubeflow's TFJob runs the same script in every task: chief and worker tasks train,
    # the ps task's bps.init() serves until the job ends and exits.
    cluster = {"chief": [f"{bed.address(0)}:2222"], "worker": [f"{bed.address(1)}:2222"],
               "ps": [f"{bed.address(2)}:2222"]}
    started = []
    for host, (kind, index) in enumerate([("chief", 0), ("worker", 0), ("ps", 0)]):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        started.append(procs.start(bed.command(host, worker_command("steady_sums.py")),
                                   base_env(TEST_ROUNDS=5, TF_CONFIG=tf_config)))
    chief, worker, ps = _all_succeed(started)
    assert "SUMS OK 0" in chief and "SUMS OK 1" in worker, chief + worker
    assert "READY" not in ps, ps


def test_kubernetes_indexed_job_pods(procs, bed):
    # Two pods of an Indexed Job named "train" behind a headless Service: each knows only
    # its completion index and hostname, and what the manifest gives (the size, pod 0's
    # address). Pod 0 runs the scheduler; each pod a server beside its worker.
    started = []
    for index in range(2):
        env = base_env(TEST_ROUNDS=5, JOB_COMPLETION_INDEX=index, HOSTNAME=f"train-{index}",
                       DMLC_NUM_WORKER=2, DMLC_PS_ROOT_URI=bed.address(0))
        started.append(procs.start(bed.command(index, worker_command("steady_sums.py")), env))
    for rank, output in enumerate(_all_succeed(started)):
        assert f"SUMS OK {rank}" in output, output


def _config(**env):
    return Config.from_env({k: str(v) for k, v in env.items()})


def test_placements_follow_each_manager():
    # Open MPI, 2 hosts of 2: rank 3 is host 1's second worker; only rank 0 starts the
    # scheduler, and only local rank 0 a server.
    ompi = dict(OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_SIZE=2,
                OMPI_MCA_ess_base_jobid=77, DMLC_PS_ROOT_URI="10.0.0.1")
    config = _config(OMPI_COMM_WORLD_RANK=3, OMPI_COMM_WORLD_LOCAL_RANK=1, **ompi)
    assert (config.role, config.rank, config.size, config.num_server) == ("worker", 3, 4, 2)
    assert not config.cluster.starts_scheduler and not config.cluster.starts_server
    leader = _config(OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_LOCAL_RANK=0, **ompi)
    assert leader.cluster.starts_scheduler and leader.cluster.starts_server
    assert leader.root_port == config.root_port  # derived alike from the job id
    # Servers the user placed are not started again; explicit variables win.
    named = _config(OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_LOCAL_RANK=0, DMLC_NUM_SERVER=3,
                    DMLC_PS_ROOT_PORT=9100, **ompi)
    assert (named.num_server, named.root_port, named.cluster.starts_server) == (3, 9100, False)
    # Intel MPI / MPICH.
    pmi = _config(PMI_RANK=1, PMI_SIZE=2, MPI_LOCALRANKID=1, MPI_LOCALNRANKS=2, PMI_JOBID="j")
    assert (pmi.rank, pmi.root_uri) == (1, "127.0.0.1")
    # TF_CONFIG without ps tasks: every worker task runs a server beside it.
    tf_config = {"cluster": {"worker": ["w0:2222", "w1:2222"]}, "task": {"type": "worker",
                                                                       "index": 1}}
    config = _config(TF_CONFIG=json.dumps(tf_config))
    assert (config.rank, config.num_server, config.root_uri, config.root_port) == \
        (1, 2, "w0", 2222)
    assert config.cluster.starts_server and not config.cluster.starts_scheduler
    # DMLC_ROLE set: the job was described by hand, nothing is implied.
    assert _config(DMLC_ROLE="worker", TF_CONFIG=json.dumps(tf_config)).cluster is None
    # A Kubernetes Indexed Job: the completion index is the rank; pods derive one port
    # from the job's name (their hostnames without the index).
    indexed = dict(DMLC_NUM_WORKER=3, DMLC_PS_ROOT_URI="train-0.workers")
    pod = _config(JOB_COMPLETION_INDEX=2, HOSTNAME="train-2", **indexed)
    assert (pod.role, pod.rank, pod.size, pod.num_server, pod.root_uri) == \
        ("worker", 2, 3, 3, "train-0.workers")
    assert pod.cluster.starts_server and not pod.cluster.starts_scheduler
    first = _config(JOB_COMPLETION_INDEX=0, HOSTNAME="train-0", **indexed)
    assert first.cluster.starts_scheduler and first.root_port == pod.root_port
    # Server pods of their own (DMLC_NUM_SERVER): the worker pods start none.
    assert not _config(JOB_COMPLETION_INDEX=1, HOSTNAME="train-1", DMLC_NUM_SERVER=2,
                       **indexed).cluster.starts_server
    # Volcano: a pod finds its task (worker or ps) by its hostname in VC_<TASK>_HOSTS.
    volcano = dict(VC_TASK_INDEX=1, VC_WORKER_HOSTS="job-worker-0.job,job-worker-1.job",
                   VC_PS_HOSTS="job-ps-0.job")
    worker = _config(HOSTNAME="job-worker-1", **volcano)
    assert (worker.role, worker.rank, worker.size, worker.num_server, worker.root_uri) == \
        ("worker", 1, 2, 1, "job-worker-0.job")
    assert not worker.cluster.starts_server and not worker.cluster.starts_scheduler
    server = _config(HOSTNAME="job-ps-0", **volcano)
    assert (server.role, server.num_server, server.root_port) == ("server", 1,
                                                                   worker.root_port)


def test_placements_tf_bps_cannot_run_are_refused():
    cases = [
        (dict(OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_RANK=0,
              OMPI_COMM_WORLD_LOCAL_SIZE=2, DMLC_PS_ROOT_URI="h", OMPI_MCA_ess_base_jobid=1),
         "ranks numbered host by host"),
        (dict(OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_RANK=0,
              OMPI_COMM_WORLD_LOCAL_SIZE=2, OMPI_MCA_ess_base_jobid=1),
         "set DMLC_PS_ROOT_URI to the address of the host of rank 0"),
        (dict(TF_CONFIG="{not json"), "TF_CONFIG is not valid"),
        (dict(TF_CONFIG=json.dumps({"cluster": {"worker": ["a:1"]},
                                    "task": {"type": "evaluator", "index": 0}})),
         "task type 'evaluator' takes no part"),
        (dict(SLURM_PROCID=0, SLURM_NTASKS=2, SLURM_LOCALID=0, SLURM_NODELIST="n[1-x]"),
         "SLURM_NODELIST='n[1-x]': cannot read '1-x'"),
        (dict(JOB_COMPLETION_INDEX=0, DMLC_PS_ROOT_URI="t-0.s"),
         "set DMLC_NUM_WORKER to the job's completions"),
        (dict(JOB_COMPLETION_INDEX=0, DMLC_NUM_WORKER=2),
         "set DMLC_PS_ROOT_URI to pod 0's name"),
        (dict(JOB_COMPLETION_INDEX=2, DMLC_NUM_WORKER=2, DMLC_PS_ROOT_URI="t-0.s"),
         "JOB_COMPLETION_INDEX=2 is not below DMLC_NUM_WORKER=2"),
        (dict(VC_TASK_INDEX=0, VC_WORKER_HOSTS="j-worker-0.j", HOSTNAME="other"),
         "HOSTNAME='other' is none of the Volcano job's"),
    ]
    for env, message in cases:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
            _config(**env)


def test_slurm_node_lists_expand():
    # Every form Slurm writes, as `scontrol show hostnames` expands it.
    assert expand_nodelist("node[01-03,07],gpu5,a[9-10]") == [
        "node01", "node02", "node03", "node07", "gpu5", "a9", "a10"]
    assert expand_nodelist("10.0.0.[1-2]") == ["10.0.0.1", "10.0.0.2"]
    assert expand_nodelist("node[1-2]-ib") == ["node1-ib", "node2-ib"]  # a suffix
    assert expand_nodelist("rack[1-2]-node[1-2]") == [  # several groups, the first outermost
        "rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]
    assert expand_nodelist("n[008-011]") == ["n008", "n009", "n010", "n011"]  # padding
    assert expand_nodelist("a,b-[1,3-4]x,c") == ["a", "b-1x", "b-3x", "b-4x", "c"]
    assert expand_nodelist(" single ") == ["single"]
    for bad, part in [("n[1-x]", "1-x"), ("n[3-1]", "3-1"), ("n[]", ""), ("n[1-2", "n[1-2"),
                      ("n]1[", "n]1["), ("n[[1]]", "n[[1]]")]:
        with pytest.raises(ClusterError, match=re.escape(f"cannot read {part!r}")):
            expand_nodelist(bad)
