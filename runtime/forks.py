"""Models keep working in a process forked after they ran (pre-fork servers, multiprocessing).

Why: TVM keeps one thread pool per calling thread, started by its first parallel kernel. A
forked child has only the thread that forked, and that thread's pool still points at worker
threads that do not exist in the child: its next parallel kernel waited for them forever
(gunicorn --preload with a warm-up request, multiprocessing's fork start method).

How: ``os.register_at_fork`` marks, in the child, the forking thread as stale when it had run
a model; runs from a stale thread go to a helper thread of the child's, whose own pool TVM
starts fresh, with every worker. Other threads of the child are new and start their own pools.
The locks a parent thread may have held during the fork (a model's run lock) are replaced in
the child, since the thread holding them does not exist there."""

from __future__ import annotations

import os
import queue
import threading
import weakref
from typing import Callable, TypeVar

T = TypeVar("T")

_RAN: set[int] = set()     # threads (of this process) whose TVM pool has started
_STALE: set[int] = set()   # threads whose pool was inherited from a parent process
_LOCKED = weakref.WeakSet()  # objects with a ``_lock`` to replace in a child
_HELPER: dict[str, "_Helper"] = {}


def run(work: Callable[[], T]) -> T:
    """``work()`` (which runs TVM kernels), on a thread whose TVM pool is alive."""
    me = threading.get_ident()
    if me in _STALE:
        return _helper().call(work)
    _RAN.add(me)
    return work()


def track_lock(owner) -> None:
    """Give ``owner._lock`` a new lock in every forked child."""
    _LOCKED.add(owner)


class _Helper:
    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="aotc-after-fork", daemon=True).start()

    def call(self, work: Callable[[], T]) -> T:
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs.put((work, done))
        ok, value = done.get()
        if ok:
            return value
        raise value

    def _serve(self) -> None:
        while True:
            work, done = self._jobs.get()
            try:
                done.put((True, work()))
            except BaseException as err:  # pylint: disable=broad-except
                done.put((False, err))  # re-raised in the calling thread


def _helper() -> _Helper:
    if "helper" not in _HELPER:
        _HELPER["helper"] = _Helper()
    return _HELPER["helper"]


def _after_fork_in_child() -> None:
    me = threading.get_ident()
    stale = me in _RAN or me in _STALE
    _RAN.clear()
    _STALE.clear()  # the other threads are gone; a new one may reuse an ident
    if stale:
        _STALE.add(me)
    _HELPER.clear()  # the parent's helper thread did not come along
    for owner in list(_LOCKED):
        owner._lock = threading.Lock()  # pylint: disable=protected-access


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
