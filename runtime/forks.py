"""Models keep working in a process forked after they ran (pre-fork servers, multiprocessing).

Why: TVM keeps one thread pool per calling thread, started by its first parallel kernel. A
forked child has only the thread that forked, and that thread's pool still points at worker
threads that do not exist there: its next parallel kernel waited for them forever (gunicorn
--preload with a warm-up request, multiprocessing's fork start method).

How: ``os.register_at_fork`` runs, in the child, TVM's ``ResetThreadPool`` for the forking
thread when its pool had started: right after the fork, before the child makes any thread,
the old workers' joins return at once and the pool starts new ones. Other threads of the child
are new and start their own pools. Locks a parent thread may have held during the fork (a
model's run lock) are replaced in the child, since the thread holding them is gone there.
Where the runtime library lacks ``ResetThreadPool``, a run from the stale thread raises
ModelRunError at once instead of hanging. The C++ runtime does the same (threads.cc)."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from aotc.errors import ModelRunError

from ._tvm_runtime import runtime_function

T = TypeVar("T")

# tvm::runtime::threading::ResetThreadPool(), exported by libtvm_runtime.so (TVM_DLL)
_RESET_SYMBOL = "_ZN3tvm7runtime9threading15ResetThreadPoolEv"
_RAN: set[int] = set()     # threads (of this process) whose TVM pool has started
_STALE: set[int] = set()   # threads whose pool is the parent's and could not be reset
_LOCKED: weakref.WeakSet = weakref.WeakSet()  # objects with a ``_lock`` to replace in a child


def run(work: Callable[[], T]) -> T:
    """``work()`` (which runs TVM kernels), after checking that this thread's pool is alive."""
    me = threading.get_ident()
    if me in _STALE:
        raise ModelRunError("this thread's TVM thread pool was started before the process "
                            "forked and cannot be restarted here (the runtime library has no "
                            "ResetThreadPool): run the model from another thread of the child")
    if me not in _RAN:
        _reset_function()  # resolved here, not in the child right after a fork
        _RAN.add(me)
    return work()


def track_lock(owner) -> None:
    """Give ``owner._lock`` a new lock in every forked child."""
    _LOCKED.add(owner)


def _reset_function():
    return runtime_function(_RESET_SYMBOL)


def _after_fork_in_child() -> None:
    me = threading.get_ident()
    ran = me in _RAN
    _RAN.clear()
    _STALE.clear()  # the other threads are gone; a new one may reuse an ident
    if ran:
        reset = _reset_function()
        if reset is None:
            _STALE.add(me)
        else:
            reset()
            _RAN.add(me)
    for owner in list(_LOCKED):
        owner._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
