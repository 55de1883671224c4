"""RayExecutor: a tf_bps job whose workers, servers and scheduler are Ray actors, with
the API of Horovod's RayExecutor, so that a script moves over by changing its import.

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=4)
    executor.start()
    results = executor.run(train, kwargs={"epochs": 2})   # every rank's, in rank order
    executor.shutdown()

Ray places the workers (a placement group), and tf_bps's own job forms over them: a
scheduler beside rank 0 and one server on every worker node, each the ordinary process,
run by an actor of its own that Ray placed on that node. Nothing here is on the training
path: once `start()` returns, the workers talk to the servers as under bpslaunch.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from tf_bps.ray.actors import JobProcess, Worker
from tf_bps.ray.layout import JobLayout, plan_job

log = logging.getLogger("tf_bps.ray")

# The driver's variables that configure a job travel to every process of it, as
# bpslaunch's environment does; Ray's processes inherit the raylet's, not the driver's.
_JOB_PREFIXES = ("BYTEPS_", "HOROVOD_", "PS_", "DMLC_INTERFACE", "TF_CPP_MIN_LOG_LEVEL")
# How long the scheduler and servers get to exit by themselves once the workers left.
EXIT_GRACE_S = 10.0


@dataclass(frozen=True)
class RaySettings:
    """What create_settings() returns."""

    timeout_s: float = 30  # for the job to form once the workers are placed
    placement_group_timeout_s: float = 100  # for Ray to find the workers' resources


class RayExecutor:
    """A job of `num_workers` workers (placed by Ray, packed onto few nodes), or of
    `num_hosts` nodes of `num_workers_per_host` workers each (one node apiece)."""

    @staticmethod
    def create_settings(timeout_s: float = 30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s: float = 100, nics=None) -> RaySettings:
        """Horovod's signature. ssh is not used (Ray starts every process) and neither
        are `nics` (each process advertises its node's address as Ray knows it): they
        are accepted so that Horovod scripts run unchanged."""
        del ssh_identity_file, ssh_str, nics
        if timeout_s <= 0 or placement_group_timeout_s <= 0:
            raise ValueError("timeout_s and placement_group_timeout_s must be positive")
        return RaySettings(timeout_s, placement_group_timeout_s)

    def __init__(self, settings: RaySettings | None = None, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, placement_strategy: str | None = None):
        if (num_workers is None) == (num_hosts is None):
            raise ValueError("give either num_workers, or num_hosts (with "
                             "num_workers_per_host)")
        for name, value in (("num_workers", num_workers), ("num_hosts", num_hosts),
                            ("num_workers_per_host", num_workers_per_host)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker needs use_gpu=True")
        self.settings = settings or RaySettings()
        self.num_workers = num_workers or num_hosts * num_workers_per_host
        self._per_bundle = 1 if num_hosts is None else num_workers_per_host
        self._worker_resources = {"num_cpus": cpus_per_worker,
                                  "num_gpus": (gpus_per_worker or 1) if use_gpu else 0}
        # Whole nodes for num_hosts (one bundle each, on different nodes); otherwise
        # Horovod's default, as few nodes as the workers fit on.
        self._strategy = placement_strategy or ("PACK" if num_hosts is None else
                                                "STRICT_SPREAD")
        self._group = None
        self._workers: list = []  # actors, in creation order
        self._job_processes: list = []  # the scheduler's actor, then one per server
        self.layout: JobLayout | None = None
        # The scheduler's process id, then each server's, each on its own node.
        self.job_process_ids: list[int] = []
        self._failure: str | None = None

    # -- starting and ending ---------------------------------------------------------

    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars: dict | None = None) -> None:
        """Places the workers, starts the scheduler and servers, and has every worker
        join the job (bps.init() in its process). Raises, having ended everything it
        started, if any step does not finish within the settings' timeouts."""
        if self._workers:
            raise RuntimeError("this executor has started already: shutdown() first")
        try:
            self._place(executable_cls, executable_args, executable_kwargs)
            self._form_job({**driver_job_variables(), **(extra_env_vars or {})})
        except BaseException:
            self.shutdown()
            raise

    def _place(self, executable_cls, executable_args, executable_kwargs) -> None:
        cpus, gpus = (self._worker_resources[k] * self._per_bundle
                      for k in ("num_cpus", "num_gpus"))
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        num_bundles = self.num_workers // self._per_bundle
        self._group = placement_group([bundle] * num_bundles, strategy=self._strategy)
        ready, _ = ray.wait([self._group.ready()],
                            timeout=self.settings.placement_group_timeout_s)
        if not ready:
            raise TimeoutError(
                f"Ray found no room for {num_bundles} bundle(s) of {bundle} ({self._strategy}) "
                f"within {self.settings.placement_group_timeout_s} s; the cluster has "
                f"{_free_processors()} free")
        actor = ray.remote(Worker)
        self._workers = [
            actor.options(**self._worker_resources, scheduling_strategy=(
                PlacementGroupSchedulingStrategy(self._group, index // self._per_bundle)))
            .remote(executable_cls, executable_args, executable_kwargs)
            for index in range(self.num_workers)]

    def _form_job(self, extra: dict[str, str]) -> None:
        timeout = self.settings.timeout_s
        self.layout = layout = plan_job(self._get([w.where.remote() for w in self._workers],
                                                  "report its node", timeout))
        helper = ray.remote(JobProcess)
        self._job_processes = [
            helper.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                node, soft=False)).remote() for node in (layout.nodes[0], *layout.nodes)]
        scheduler, servers = self._job_processes[0], self._job_processes[1:]
        port = self._get([scheduler.free_port.remote()], "pick the scheduler's port",
                         timeout)[0]
        job = {**{k: str(v) for k, v in extra.items()},
               "DMLC_PS_ROOT_URI": layout.addresses[0], "DMLC_PS_ROOT_PORT": str(port),
               "DMLC_NUM_WORKER": layout.variables[0]["DMLC_NUM_WORKER"],
               "DMLC_NUM_SERVER": str(len(servers)),
               "BYTEPS_JOB_TOKEN": extra.get("BYTEPS_JOB_TOKEN") or secrets.token_hex(24),
               "HOROVOD_START_TIMEOUT": str(int(timeout))}
        self.job_process_ids = self._get([scheduler.start.remote("scheduler", job)] +
                  [server.start.remote("server", {**job, "DMLC_NODE_HOST": address})
                   for server, address in zip(servers, layout.addresses, strict=True)],
                  "start the scheduler and servers", timeout)
        joins = [self._workers[index].join.remote({**job, **variables}) for index, variables
                 in zip(layout.actor_of_rank, layout.variables, strict=True)]
        ranks = self._get(joins, "join the job", timeout + 30)
        if ranks != list(range(layout.num_workers)):
            raise RuntimeError(f"the scheduler numbered the workers {ranks}, not in the "
                               "order Ray placed them")
        log.info("tf_bps job of %d worker(s) on %d node(s) formed; scheduler at %s:%s",
                 layout.num_workers, len(layout.nodes), layout.addresses[0], port)

    def shutdown(self) -> None:
        """Every worker leaves the job, the scheduler and servers end, and the actors and
        their placement group are released. Safe to call more than once."""
        if self._workers:
            self._get_quietly([w.leave.remote() for w in self._workers], EXIT_GRACE_S)
        if self._job_processes:
            self._get_quietly([p.stop.remote(EXIT_GRACE_S) for p in self._job_processes],
                              EXIT_GRACE_S + 10)
        for actor in self._workers + self._job_processes:
            ray.kill(actor)
        if self._group is not None:
            remove_placement_group(self._group)
        self._workers, self._job_processes, self._group = [], [], None
        self.layout, self._failure = None, None

    # -- running functions ------------------------------------------------------------

    def run(self, fn, args=None, kwargs=None) -> list:
        """fn(*args, **kwargs) on every worker; their results in rank order."""
        return self._gather(self.run_remote(fn, args, kwargs))

    def run_remote(self, fn, args=None, kwargs=None) -> list:
        """As run(), without waiting: one ObjectRef per rank, in rank order."""
        return [worker.run.remote(fn, tuple(args or ()), dict(kwargs or {}))
                for worker in self._ranked_workers()]

    def execute(self, fn) -> list:
        """fn(executable) on every worker (the start()'s executable_cls object, or None);
        the results in rank order."""
        return self._gather([worker.execute.remote(fn) for worker in self._ranked_workers()])

    def execute_single(self, fn):
        """fn(executable) on rank 0 alone."""
        return self._gather([self._ranked_workers()[0].execute.remote(fn)])[0]

    def _ranked_workers(self) -> list:
        if self.layout is None:
            raise RuntimeError("the executor has no job: call start() first")
        if self._failure:
            raise RuntimeError(f"the job failed ({self._failure}): shutdown() and start() "
                               "again")
        return [self._workers[index] for index in self.layout.actor_of_rank]

    def _gather(self, refs: list) -> list:
        """The results by rank. The first rank that fails ends the job (its worker told
        the scheduler, which ends the others) and is named in the error."""
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
                # A task's error carries the function's own exception; an actor's, how the
                # process was lost.
                cause = getattr(error, "cause", None)
                reason = f"{type(cause).__name__}: {cause}" if cause else str(error)
                self._failure = f"worker rank {rank_of[done[0]]} failed"
                raise RuntimeError(f"{self._failure}: {reason}") from error
        return ray.get(refs)

    @staticmethod
    def _get(refs: list, what: str, timeout: float) -> list:
        ready, missing = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if missing:
            raise TimeoutError(f"{len(missing)} of {len(refs)} actor(s) did not {what} "
                               f"within {timeout} s")
        return ray.get(refs)

    @staticmethod
    def _get_quietly(refs: list, timeout: float) -> None:
        """For shutdown: whatever failed already is reported elsewhere."""
        ray.wait(refs, num_returns=len(refs), timeout=timeout)


def _free_processors() -> dict[str, float]:
    return {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}


def driver_job_variables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_JOB_PREFIXES)}
