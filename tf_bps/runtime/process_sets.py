"""Process sets: the group of workers an operation runs over (Horovod's `process_set=`).

A set is registered with `add_process_set` (or `bps.init(process_sets=[...])`) by every
worker, in the same order, and gets an id that every worker agrees on; operations then
name it with `process_set=`. Ranks are always global ranks (a broadcast's root too);
results of gathers follow the set's rank order. Imports no TensorFlow.
"""

from __future__ import annotations

import collections

from tf_bps.runtime import core


class ProcessSet:
    """A set of worker ranks (kept sorted). Its `process_set_id` is None until it is
    registered; the global set, of every worker, has id 0."""

    def __init__(self, ranks):
        ranks = list(ranks)
        if not all(isinstance(r, int) for r in ranks):
            raise ValueError(f"process set ranks must be integers, got {ranks!r}")
        self.ranks = sorted(ranks)
        self.process_set_id = None

    def size(self) -> int | None:
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self) -> int | None:
        """This worker's index in the set (operations still take global ranks)."""
        if self.process_set_id is None:
            return None
        if _worker_rank() not in self.ranks:
            raise ValueError("this worker is not part of the process set")
        return self.ranks.index(_worker_rank())

    def included(self) -> bool:
        return _worker_rank() in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_registered: dict[int, ProcessSet] = {}
_free_ids: collections.deque[int] = collections.deque()
_rank: int | None = None  # this worker's, from init (basics.py tells, via _reset)


def _reset(rank: int | None, size: int) -> None:
    """At init: the global set is every worker; no other set is registered. At
    shutdown (no rank): none is."""
    global _rank
    _rank = rank
    global_process_set.ranks = list(range(size))
    for process_set in _registered.values():
        process_set.process_set_id = None
    _registered.clear()
    _free_ids.clear()


def add_process_set(process_set) -> ProcessSet:
    """Registers `process_set` (a ProcessSet or a list of ranks); every worker must add
    the same sets in the same order. Returns the set, with its id."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set!r} is already registered")
    _worker_rank()  # initialised
    size = len(global_process_set.ranks)
    ranks = process_set.ranks
    if not ranks or any(not 0 <= r < size for r in ranks) or len(set(ranks)) != len(ranks):
        raise ValueError(f"process set ranks must be distinct ranks of this job (size "
                         f"{size}), got {ranks!r}")
    for existing in [global_process_set, *_registered.values()]:
        if existing.ranks == ranks:
            raise ValueError(f"a process set with ranks {ranks!r} already exists "
                             f"(id {existing.process_set_id})")
    set_id = _free_ids.popleft() if _free_ids else len(_registered) + 1
    core.worker_set_process_set(set_id, ranks)
    process_set.process_set_id = set_id
    _registered[set_id] = process_set
    return process_set


def _worker_rank() -> int:
    if _rank is None:
        raise ValueError("tf_bps is not initialised: call bps.init() first")
    return _rank


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregisters a set added before; False for the global set or an unknown one."""
    set_id = process_set.process_set_id
    if not set_id or _registered.get(set_id) is not process_set:
        return False
    core.worker_set_process_set(set_id, [])
    del _registered[set_id]
    _free_ids.append(set_id)
    process_set.process_set_id = None
    return True


def process_set_id(process_set, argument: str = "process_set") -> int:
    """The id operations pass to the core: 0 for the global set (or None)."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{argument}={process_set!r} is not a ProcessSet")
    if process_set.process_set_id is None:
        raise ValueError(f"{argument}={process_set!r} is not registered: call "
                         "bps.add_process_set first (on every worker)")
    return process_set.process_set_id


def ranks_of(set_id: int) -> list[int]:
    """The global ranks of a registered set, by id (0: every worker)."""
    if set_id == 0:
        return global_process_set.ranks
    if set_id not in _registered:
        raise ValueError(f"process set {set_id} is not registered")
    return _registered[set_id].ranks
