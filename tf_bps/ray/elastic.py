"""ElasticRayExecutor: an elastic tf_bps job whose workers follow the Ray cluster's
nodes, with the API of Horovod's ElasticRayExecutor.

    executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(), min_workers=2,
                                  max_workers=8, cpus_per_worker=2)
    executor.start()
    results = executor.run(train)   # train calls bps.init() and runs @bps.elastic.run
    executor.shutdown()

Ray's view of the cluster is the host discovery: every second the executor reads the
alive nodes and their CPUs (and GPUs), and starts a worker actor in each free slot while
the job has fewer than max_workers; the workers already training take them in at their
next commit. When a node is lost, Ray ends its actors, the scheduler misses them, and
the others go on from their last commit, as in any elastic tf_bps job. The scheduler
and the server run beside the driver for the whole job, as bpslaunch's elastic jobs do.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tf_bps.ray.actors import JobProcess, Worker
from tf_bps.ray.executor import EXIT_GRACE_S, driver_job_variables

DISCOVERY_INTERVAL_S = 1.0


@dataclass(frozen=True)
class ElasticRaySettings:
    """What create_settings() returns."""

    min_workers: int = 1
    max_workers: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600  # BYTEPS_ELASTIC_TIMEOUT: below min_workers this long
    timeout_s: float = 30  # for the first workers to be placed


@dataclass
class _Member:
    actor: object
    node_id: str
    name: str
    result: object = None  # the run's ObjectRef


class ElasticRayExecutor:
    """Workers of `cpus_per_worker` CPUs (and `gpus_per_worker` GPUs) in every free slot
    of the cluster's alive nodes, between min_workers and max_workers of them."""

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None,
                        reset_limit: int | None = None, elastic_timeout: float = 600,
                        timeout_s: float = 30, ssh_identity_file=None, nics=None,
                        **_ignored) -> ElasticRaySettings:
        """Horovod's signature (ssh and nics mean nothing under Ray)."""
        del ssh_identity_file, nics
        return ElasticRaySettings(min_num_proc, max_num_proc, reset_limit, elastic_timeout,
                                  timeout_s)

    def __init__(self, settings: ElasticRaySettings | None = None,
                 min_workers: int | None = None, max_workers: int | None = None,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, env_vars: dict | None = None):
        settings = settings or ElasticRaySettings()
        self.min_workers = min_workers or settings.min_workers
        self.max_workers = max_workers or settings.max_workers
        if self.min_workers < 1 or (self.max_workers and self.max_workers < self.min_workers):
            raise ValueError(f"need 1 <= min_workers ({self.min_workers}) <= max_workers "
                             f"({self.max_workers})")
        self.settings = settings
        self._cpus = cpus_per_worker
        self._gpus = (gpus_per_worker or 1) if use_gpu else 0
        self._env = dict(env_vars or {})
        self._helpers: list = []
        self._job: dict[str, str] = {}
        self._members: list[_Member] = []
        self._lock = threading.Lock()
        self._blacklist: set[str] = set()  # nodes where a worker's function failed
        self.sizes_started: list[int] = []  # how many workers ran after each change

    def start(self) -> None:
        """Starts the scheduler and the server on the driver's node, and waits until the
        cluster has slots for min_workers."""
        here = ray.get_runtime_context().get_node_id()
        helper = ray.remote(JobProcess).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
        self._helpers = [helper.remote(), helper.remote()]
        scheduler, server = self._helpers
        address = ray.get(scheduler.where.remote(), timeout=60)[1]
        self._job = {**driver_job_variables(), **{k: str(v) for k, v in self._env.items()},
                     "BYTEPS_ELASTIC": "1", "BYTEPS_ELASTIC_MIN_WORKERS": str(self.min_workers),
                     "BYTEPS_ELASTIC_TIMEOUT": str(self.settings.elastic_timeout),
                     "DMLC_PS_ROOT_URI": address,
                     "DMLC_PS_ROOT_PORT": str(ray.get(scheduler.free_port.remote(), timeout=60)),
                     "DMLC_NUM_SERVER": "1", "BYTEPS_LOCAL_SIZE": "1",
                     "BYTEPS_JOB_TOKEN": self._env.get("BYTEPS_JOB_TOKEN") or secrets.token_hex(24)}
        if self.max_workers:
            self._job["BYTEPS_ELASTIC_MAX_WORKERS"] = str(self.max_workers)
        if self.settings.reset_limit is not None:
            self._job["BYTEPS_ELASTIC_RESET_LIMIT"] = str(self.settings.reset_limit)
        deadline = time.monotonic() + self.settings.timeout_s
        while (slots := len(self._free_slots())) < self.min_workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Ray cluster has {slots} slot(s) of {self._cpus} "
                                   f"CPU(s), fewer than min_workers={self.min_workers}, "
                                   f"after {self.settings.timeout_s} s")
            time.sleep(DISCOVERY_INTERVAL_S)
        self._job["DMLC_NUM_WORKER"] = str(min(slots, self.max_workers or 1 << 30))
        ray.get([scheduler.start.remote("scheduler", self._job),
                 server.start.remote("server", {**self._job, "DMLC_NODE_HOST": address})],
                timeout=60)

    def run(self, worker_fn, args=None, kwargs=None, callbacks=None) -> list:
        """Runs worker_fn(*args, **kwargs) in every worker, and in every worker started
        later as nodes join, until all have returned; the results of those that finished,
        in the order they were started. Fails only when no worker finished (bpslaunch's
        elastic rule: a failed worker or a lost node costs its worker, not the job).
        Horovod's `callbacks` (fed by its workers' result queue) have no counterpart."""
        if callbacks:
            raise ValueError("ElasticRayExecutor.run takes no callbacks: return what the "
                             "driver needs from worker_fn")
        call = (worker_fn, tuple(args or ()), dict(kwargs or {}))
        self._fill(call)
        stop = threading.Event()
        poll = threading.Thread(target=self._follow_nodes, args=(call, stop), daemon=True,
                                name="ray-node-discovery")
        poll.start()
        try:
            while True:
                with self._lock:
                    refs = [m.result for m in self._members]
                _, pending = ray.wait(refs, num_returns=len(refs), timeout=DISCOVERY_INTERVAL_S)
                if not pending:
                    with self._lock:
                        if len(self._members) == len(refs):
                            break
        finally:
            stop.set()
            poll.join()
        return self._results()

    def _results(self) -> list:
        results, failures = [], []
        for member in self._members:
            try:
                results.append(ray.get(member.result))
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
                cause = getattr(error, "cause", None)
                failures.append(f"{member.name}: {type(cause).__name__}: {cause}" if cause
                                else f"{member.name}: {error}")
        if not results:
            raise RuntimeError("every worker of the elastic job failed: " + "; ".join(failures))
        return results

    def shutdown(self) -> None:
        members, self._members = self._members, []
        if self._helpers:
            ray.wait([h.stop.remote(EXIT_GRACE_S) for h in self._helpers],
                     num_returns=len(self._helpers), timeout=EXIT_GRACE_S + 10)
        for actor in [m.actor for m in members] + self._helpers:
            ray.kill(actor)
        self._helpers = []

    # -- following the cluster ------------------------------------------------------

    def _follow_nodes(self, call, stop: threading.Event) -> None:
        while not stop.wait(DISCOVERY_INTERVAL_S):
            self._fill(call)

    def _fill(self, call) -> None:
        """Starts a worker in each free slot while the job has fewer than max_workers,
        until one worker has finished (the training is over). A node where a worker's
        function failed gets no other (bpslaunch's blacklist, for good)."""
        with self._lock:
            running = []
            for member in self._members:
                outcome = _outcome(member.result)
                if outcome == "finished":
                    return
                if outcome == "failed":
                    self._blacklist.add(member.node_id)
                elif outcome == "running":
                    running.append(member)
            room = (self.max_workers or 1 << 30) - len(running)
            slots = self._free_slots(running)[:max(room, 0)]
            for node_id in slots:
                index = len(self._members)
                name = f"{node_id[:8]}#{index}"
                actor = ray.remote(Worker).options(
                    num_cpus=self._cpus, num_gpus=self._gpus,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
                ).remote()
                # The first workers are numbered by DMLC_WORKER_ID; later ones by arrival.
                first = index < int(self._job["DMLC_NUM_WORKER"])
                variables = {**self._job, "DMLC_ROLE": "worker", "HOROVOD_HOSTNAME": node_id,
                             "BYTEPS_ELASTIC_WORKER_NAME": name,
                             "DMLC_WORKER_ID": str(index if first else 0)}
                self._members.append(_Member(actor, node_id, name,
                                             actor.join_and_run.remote(variables, *call)))
            if slots:
                self.sizes_started.append(len(running) + len(slots))

    def _free_slots(self, running: list[_Member] | None = None) -> list[str]:
        """A node id per worker the alive nodes have room for, beside the running ones."""
        taken: dict[str, int] = {}
        for member in running or []:
            taken[member.node_id] = taken.get(member.node_id, 0) + 1
        slots = []
        for node in ray.nodes():
            if not node.get("Alive") or node["NodeID"] in self._blacklist:
                continue
            resources = node.get("Resources", {})
            fit = int(resources.get("CPU", 0) // self._cpus) if self._cpus else 1 << 30
            if self._gpus:
                fit = min(fit, int(resources.get("GPU", 0) // self._gpus))
            slots += [node["NodeID"]] * max(0, fit - taken.get(node["NodeID"], 0))
        return slots


def _outcome(ref) -> str:
    """"running", "finished", "failed" (the function raised) or "lost" (the actor
    died, with its node)."""
    ready, _ = ray.wait([ref], timeout=0)
    if not ready:
        return "running"
    try:
        ray.get(ref)
    except ray.exceptions.RayTaskError:
        return "failed"
    except ray.exceptions.RayActorError:
        return "lost"
    return "finished"

