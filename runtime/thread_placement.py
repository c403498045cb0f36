"""Keep the calling thread off the cores TVM's thread pool pins its workers to.

Why: TVM's pool runs worker 0 on the calling thread, leaves that thread free to migrate, and
pins the other workers to the last cores. Linux does not always move the calling thread off a
pinned worker's core, and then the two share one core and the run is slower than one thread.

How: the first run shows which threads the pool starts (threads new after it) and the cores
they are pinned to; each later run sets the calling thread's affinity to the other allowed
cores and restores it afterwards (two system calls, microseconds). Nothing is pinned when the
workers are not (TVM_BIND_THREADS=0) or leave no core free, or on systems without
sched_setaffinity."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

from . import forks

T = TypeVar("T")
_LEARN_ATTEMPTS = 3  # a first run without any parallel kernel starts no workers


class CallerPlacement:
    def __init__(self):
        self.cores: set[int] | None = None  # where the calling thread runs; None: not known
        self._attempts = 0
        self._lock = threading.Lock()

    def run(self, work: Callable[[], T]) -> T:
        if not hasattr(os, "sched_setaffinity"):
            return work()
        if self.cores is None and self._attempts < _LEARN_ATTEMPTS:
            before = _thread_ids()
            out = work()
            self._learn(before)
            return out
        if not self.cores:
            return work()
        saved = os.sched_getaffinity(0)
        os.sched_setaffinity(0, self.cores)
        try:
            return work()
        finally:
            os.sched_setaffinity(0, saved)

    def _learn(self, before: set[int]) -> None:
        with self._lock:
            self._attempts += 1
            allowed = os.sched_getaffinity(0)
            found = [_affinity(tid) for tid in _thread_ids() - before]
            workers = [cores for cores in found if cores is not None]
            if not workers:
                return  # no pool started yet: try again on a later run
            pinned = set().union(*[c for c in workers if c < allowed])
            if len(pinned) < sum(1 for c in workers if c < allowed):
                pinned = set()  # workers share cores: not TVM's one-core-each binding
            free = allowed - pinned
            self.cores = free if pinned and free else set()


def _thread_ids() -> set[int]:
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _affinity(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except OSError:  # the thread ended
        return None


PLACEMENT = CallerPlacement()  # one per process: TVM pins every pool's workers the same way
forks.track_lock(PLACEMENT)
