"""Process-level state of a worker: init, shutdown, rank and size. No TensorFlow."""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from dataclasses import dataclass

from tf_bps import core
from tf_bps.config import Config
from tf_bps.rendezvous import SchedulerLink

log = logging.getLogger("tf_bps")


@dataclass
class _Job:
    config: Config
    rank: int
    size: int
    link: SchedulerLink | None  # None on the single-worker local path.


_lock = threading.Lock()
_job: _Job | None = None


def init() -> None:
    """Joins the job described by the DMLC_*/BYTEPS_* variables; idempotent."""
    global _job
    with _lock:
        if _job is not None:
            return
        config = Config.from_env()
        if config.role not in (None, "worker"):
            raise RuntimeError(f"bps.init() runs in workers, but DMLC_ROLE={config.role!r}")
        logging.basicConfig(format="[tf_bps %(levelname)s] %(message)s")
        log.setLevel("DEBUG" if config.log_level == "TRACE" else config.log_level)
        core.set_logging(config, f"tf_bps worker {config.rank}")
        if not config.distributed:
            core.worker_init_local()
            _job = _Job(config, rank=0, size=1, link=None)
        else:
            link = SchedulerLink(config)
            try:
                book = link.register("worker", worker_id=config.worker_id,
                                     local_rank=config.local_rank, local_size=config.local_size)
                core.worker_init(book["rank"], book["size"], book["servers"], config)
            except BaseException:
                link.close(failure="worker could not start")
                raise
            link.start_monitor(on_abort=_on_abort)
            _job = _Job(config, rank=book["rank"], size=book["size"], link=link)
            log.info("worker rank %d of %d joined; servers %s", _job.rank, _job.size,
                     book["servers"])
    atexit.register(shutdown)


def _on_abort(reason: str) -> None:
    print(f"tf_bps: the job is failing: {reason}", file=sys.stderr, flush=True)
    core.worker_abort(f"the job is failing: {reason}")


def shutdown() -> None:
    """Leaves the job: servers and the scheduler learn this worker is done."""
    global _job
    with _lock:
        job, _job = _job, None
    if job is None:
        return
    failure = core.worker_failure()
    core.worker_shutdown()
    if job.link is not None:
        job.link.close(failure=failure or None)


def _current() -> _Job:
    job = _job
    if job is None:
        raise ValueError("tf_bps is not initialised: call bps.init() first")
    return job


def is_initialized() -> bool:
    return _job is not None


def is_distributed() -> bool:
    """Whether push_pull goes through servers (False on the single-worker local path)."""
    return _current().link is not None


def rank() -> int:
    return _current().rank


def size() -> int:
    return _current().size


def local_rank() -> int:
    return _current().config.local_rank


def local_size() -> int:
    return _current().config.local_size
