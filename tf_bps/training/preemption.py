"""Preemption notices in elastic jobs: spot machines and Kubernetes' pod deletions send
SIGTERM, then wait a grace period before they kill.

A worker of an elastic job that gets SIGTERM tells the scheduler at once, finishes the
step it is in, and leaves at the next commit, where every worker stops alike (the
scheduler lets it go as if its host had left: the others re-form without a restore or a
sync, and lose no step). There the hooks given to on_preemption run, with the state just
committed (the place to save a checkpoint), the worker leaves the job, and its process
exits with status 0. A worker whose host left the job (the scheduler tells it so)
leaves at that commit the same way, without the hooks.

Only a handler of ours replaces Python's default one, and only in an elastic job's main
thread: a job that cannot re-form keeps the default, so SIGTERM ends its process at once
and the launcher ends the job, naming the signal.
"""

from __future__ import annotations

import logging
import signal
import threading

from tf_bps.runtime import basics
from tf_bps.runtime.rendezvous import RendezvousError

log = logging.getLogger("tf_bps")

_hooks: list = []
_notice: str | None = None  # the signal that told this worker to stop


def on_preemption(hook) -> None:
    """`hook(state)` runs once, in the worker that got a preemption notice, at the commit
    where it leaves the job."""
    _hooks.append(hook)


def listen() -> None:
    """Takes SIGTERM in this process, if it is an elastic job's and nobody else has."""
    if threading.current_thread() is not threading.main_thread() or \
            not basics.is_initialized() or not basics.config().elastic:
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _on_signal):
        signal.signal(signal.SIGTERM, _on_signal)


def leaves_at_commit() -> bool:
    """Whether this worker leaves the job at this commit: it got a preemption notice,
    or the scheduler let it go (its host left the job)."""
    return _notice is not None or basics.let_go_reason() is not None


def _on_signal(signum, frame) -> None:
    global _notice
    if _notice is not None:
        return
    _notice = signal.Signals(signum).name
    log.warning("worker rank %d received %s: it finishes its step and leaves the job at the "
                "next commit", basics.rank(), _notice)
    try:
        basics.tell_scheduler({"type": "preempted", "signal": _notice})
    except RendezvousError as error:
        log.warning("could not tell the scheduler of the notice (%s); leaving anyway", error)


def leave(state) -> None:
    """At the commit after the notice: the hooks (for a preemption), then out of the
    job and the process."""
    if _notice is not None:
        for hook in _hooks:
            hook(state)
        why = f"after {_notice}"
    else:
        why = f"as {basics.let_go_reason()}"
    log.warning("worker rank %d leaves the job %s; exiting", basics.rank(), why)
    basics.shutdown()
    raise SystemExit(0)
