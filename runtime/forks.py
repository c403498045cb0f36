"""Models keep working in a process forked after they ran (pre-fork servers, multiprocessing),
and the child exits normally.

Why: TVM keeps one thread pool per calling thread (a C++ ``thread_local``), started by its first
parallel kernel. A forked child has only the thread that forked. When that thread's pool had
started in the parent, the child holds a pool whose workers do not exist there, and whose
queues' condition variables still count the parent's sleeping workers as waiters. Destroying
such a condition variable waits for those waiters forever (glibc), and the pool is destroyed
both by TVM's ``ResetThreadPool`` and by the thread-local destructors that ``exit()`` runs: a
child of a process whose workers had gone to sleep hung on its first parallel run, or at its
exit even when it ran nothing (gunicorn ``--preload`` with a warm-up request, a worker's
graceful exit; at once with ``TVM_THREAD_POOL_SPIN_COUNT=0``).

How: no caller's thread ever starts a TVM pool. A run in pool mode goes to a kernel thread
that aotc starts for the calling thread (one each, so callers on different threads keep
separate pools, as with TVM alone) and that ends with it. A fork copies no kernel thread, so a
child has no pool to repair: its first pooled run starts a new kernel thread. Inline runs
(TVM's max concurrency 1) start no pool and stay on the caller's thread. Locks a parent thread
may have held during the fork (a model's run lock) are replaced in the child, since the thread
holding them is gone there. The C++ runtime does the same (threads.cc)."""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_LOCKED: weakref.WeakSet = weakref.WeakSet()  # objects with a ``_lock`` to replace in a child
_CALLER = threading.local()                   # the calling thread's KernelThread
_GENERATION = [0]  # forks so far: a kernel thread made before the last one is gone


class _Job(Generic[T]):
    __slots__ = ("work", "result", "error", "done")

    def __init__(self, work: Callable[[], T]):
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()


class KernelThread:
    """One thread that runs the pooled work of one calling thread, so that TVM's pool for it
    lives here. Stops when the calling thread ends (its thread-local reference goes)."""

    def __init__(self):
        self.generation = _GENERATION[0]
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=_serve, args=(self._jobs,), daemon=True,
                                        name="aotc-kernels")
        self._thread.start()

    def run(self, work: Callable[[], T]) -> T:
        job = _Job(work)
        self._jobs.put(job)
        job.done.acquire()
        if job.error is not None:
            raise job.error
        return job.result

    def __del__(self):
        if self.generation == _GENERATION[0]:  # its thread exists in this process
            self._jobs.put(None)


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        try:
            job.result = job.work()
        except BaseException as err:  # noqa: B036 - handed to the caller, which raises it
            job.error = err
        finally:
            job.done.release()
        del job


def run_pooled(work: Callable[[], T]) -> T:
    """``work()`` (TVM kernels that may use the thread pool), on the calling thread's kernel
    thread."""
    kernels = getattr(_CALLER, "kernels", None)
    if kernels is None or kernels.generation != _GENERATION[0]:
        kernels = _CALLER.kernels = KernelThread()
    return kernels.run(work)


def track_lock(owner) -> None:
    """Give ``owner._lock`` a new lock in every forked child."""
    _LOCKED.add(owner)


def _after_fork_in_child() -> None:
    _GENERATION[0] += 1
    for owner in list(_LOCKED):
        owner._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
