"""Children that die with the process that started them: the kernel sends such a child
SIGKILL once its parent ends, however the parent ends (PR_SET_PDEATHSIG, Linux), so
that a launcher killed outright (kill -9, a lost container, an engine ending its task or
actor) leaves none of its job's processes behind in their sessions of their own.

The kernel ties the child to the thread that started it: start children from a thread
that lives as long as they should (the launcher's main thread, an engine's task)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_this_process(then: Callable[[], None] | None = None) -> Callable[[], None]:
    """A `preexec_fn` for subprocess.Popen that binds the child's life to this process's
    and then runs `then` (also in the child, before exec)."""
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

    def preexec() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # The parent died while this one started.
            os._exit(1)
        if then is not None:
            then()
    return preexec
