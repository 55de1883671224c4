"""Process sets: the group of workers an operation runs over (Horovod's `process_set=`).

This version runs every operation over all workers, so `global_process_set` is the one
set there is; scripts that pass it work unchanged, and any other value is refused with
a message instead of being ignored.
"""

from __future__ import annotations


class ProcessSet:
    """A set of worker ranks. `ranks=None` means every worker of the job."""

    def __init__(self, ranks=None):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)

    def __repr__(self) -> str:
        return "global_process_set" if self.ranks is None else f"ProcessSet({self.ranks})"


global_process_set = ProcessSet()


def check_process_set(process_set, argument: str = "process_set") -> None:
    """Accepts the global set (or None); refuses any other, naming `argument`."""
    if process_set is None or process_set is global_process_set:
        return
    if isinstance(process_set, ProcessSet) and process_set.ranks is None:
        return
    raise ValueError(
        f"{argument}={process_set!r} is not supported: tf_bps runs every operation over all "
        "workers; pass global_process_set (the default) or leave it out")
