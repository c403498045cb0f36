"""Each run of a model picks between TVM's thread pool and one thread, by what the CPU gives.

Why: TVM's pool pins its workers to cores and spins between kernels. On an idle machine that
is the fastest way to run; beside one busy process on the same cores it collapses (a kernel's
join waits for a pinned worker the scheduler has given to the neighbour: MobileNetV2 ran 10-60x
its idle time where one thread ran 2x). A thread count fixed at start cannot serve both.

How: a model runs in "pool" mode (every thread) or "inline" mode (TVM's per-thread
``SetMaxConcurrency(1)``: each parallel loop runs on the calling thread and the pool's workers
stay asleep). It starts in pool mode and runs the 4th run of each input size inline, so that
it knows both times. It leaves pool mode when the typical pool run of a size takes 1.5x the
typical inline run of the same size. In inline mode it watches the other cores it may use
(/proc/stat): once they have been mostly idle since the last look, the pool is tried for 3
runs (the first wakes its sleeping workers) and kept when its best run, against the inline
time of its own size, beats inline; a failed try doubles the wait before the next, in runs (up
to 256) and in seconds (0.25 s after the first failure, up to 16 s), so that a busy machine
pays for few slow tries. The seconds matter for small models, whose pool never wins: a try
wakes the pool's workers, and TVM's workers then spin (sched_yield) long after the try ends:
tries spaced in runs alone kept a second core spinning most of the time (measurements.md).

Typical times are medians of the last 5 runs of a size. Times are compared within a size only:
a server's requests come in many sizes, and a batch of 4 run in the pool is slower than a
batch of 1 run inline without any contention (comparing across sizes sent such models to one
thread, at twice the time).

The choice is per Model, and the concurrency setting per calling thread (TVM keeps both the
pool and the setting per thread), so models on other threads are not affected."""

from __future__ import annotations

import ctypes
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeVar

from ._tvm_runtime import runtime_function

T = TypeVar("T")

POOL, INLINE = "pool", "inline"
_WINDOW = 5            # runs per mode in a typical time
_SLOWER = 1.5          # a pool run this much slower than inline: contention
_FIRST_TRY = 8         # runs in inline mode before the first pool try
_TRIAL = 3             # pool runs in a try (the best counts: the first wakes sleeping workers)
_PROBE_RUN = 4         # the inline run of pool mode (the pool's first runs start it)
_LONGEST_WAIT = 256    # runs between pool tries at most
_FIRST_PAUSE = 0.25    # seconds after a first failed try before the next; doubles per failure
_LONGEST_PAUSE = 16.0  # seconds between pool tries at most
_SIZES = 64            # input sizes whose times are kept (the least recently run go first)
_IDLE_ENOUGH = 0.6     # share of the other cores idle since the last look to try the pool
_MIN_JIFFIES = 5       # per core, in a look at /proc/stat
_LOOK_SECONDS = 0.05   # between reads of /proc/stat (_MIN_JIFFIES of 10 ms)
_SET_MAX = "_ZN3tvm7runtime9threading17SetMaxConcurrencyEi"  # TVM_DLL, per calling thread


class Parallelism:
    def __init__(self, threads: int, policy: str = "adaptive", clock=time.perf_counter):
        if policy not in ("adaptive", POOL, INLINE):
            raise ValueError(f"AOTC_PARALLELISM must be adaptive, pool or inline, got {policy!r}")
        self.enabled = threads > 1 and policy != POOL and _set_max_concurrency() is not None
        self.fixed = policy == INLINE
        self.mode = INLINE if self.fixed else POOL
        self.sizes: OrderedDict[Hashable, _Size] = OrderedDict()  # least recently run first
        self.wait, self.inline_runs = _FIRST_TRY, 0
        self.pause, self.tried = 0.0, 0.0  # seconds between tries; when the last one ended
        self.trial: list[float] = []  # a pool try's run times over inline ones of their size
        self.idle = IdleCores(clock)
        self.clock = clock

    def run(self, work: Callable[[], T], pool_work: Callable[[], T] | None = None,
            size: Hashable = ()) -> T:
        """``work()`` in the mode chosen for this run (``pool_work`` in pool mode, if given:
        the caller's placement around the pool's workers). ``size`` names the run's input
        size (its shapes): times are compared between runs of one size only."""
        if not self.enabled:
            return (pool_work or work)()
        seen = self._size(size)
        mode = self._choose(seen)
        start = self.clock()
        if mode == POOL:
            out = (pool_work or work)()
        else:
            out = _inline(work)
        self._record(mode, self.clock() - start, seen.times)
        return out

    def _size(self, size: Hashable) -> _Size:
        seen = self.sizes.pop(size, None) or _Size()
        self.sizes[size] = seen  # most recent last
        if len(self.sizes) > _SIZES:
            self.sizes.popitem(last=False)
        return seen

    def _choose(self, seen: _Size) -> str:
        seen.runs += 1
        if self.fixed:
            return INLINE
        if self.mode == POOL:
            # one inline run of each size once the pool is warm, so both times are known
            return INLINE if seen.runs == _PROBE_RUN else POOL
        if self.trial:  # a pool try runs _TRIAL runs in a row: the first wakes the workers
            return POOL
        self.inline_runs += 1
        if self.inline_runs >= self.wait and self.clock() - self.tried >= self.pause \
                and self.idle.mostly_idle():
            return POOL
        return INLINE

    def _record(self, mode: str, seconds: float, times: dict) -> None:
        if self.mode == INLINE and mode == POOL:
            self._record_try(seconds, times)
            return
        times[mode].append(seconds)
        if self.mode != POOL:
            return
        pool, inline = _typical(times[POOL]), _typical(times[INLINE])
        if pool is not None and inline is not None and pool > _SLOWER * inline:
            self._switch(INLINE)

    def _record_try(self, seconds: float, times: dict) -> None:
        inline = _typical(times[INLINE])
        self.trial.append(seconds / inline if inline else float("inf"))  # a new size: unknown
        if len(self.trial) < _TRIAL:
            return
        best, self.trial = min(self.trial), []
        if best < 1.0:
            self._switch(POOL)
            times[POOL].append(seconds)
        else:  # still slower: wait twice as long before the next try
            self.wait, self.inline_runs = min(2 * self.wait, _LONGEST_WAIT), 0
            self.pause = min(max(2 * self.pause, _FIRST_PAUSE), _LONGEST_PAUSE)
            self.tried = self.clock()

    def _switch(self, mode: str) -> None:
        self.mode, self.inline_runs = mode, 0
        if mode == POOL:
            self.wait, self.pause = _FIRST_TRY, 0.0
            for seen in self.sizes.values():
                seen.times[POOL].clear()
        else:
            self.idle.restart()


@dataclass
class _Size:
    """The runs of one input size: how many, and the last run times in each mode."""
    runs: int = 0
    times: dict[str, deque[float]] = field(default_factory=lambda: {
        POOL: deque(maxlen=_WINDOW), INLINE: deque(maxlen=_WINDOW)})


def _typical(times) -> float | None:
    """The median (statistics.median's checks cost more than sorting five numbers)."""
    if not times:
        return None
    ordered = sorted(times)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def _inline(work: Callable[[], T]) -> T:
    set_max = _set_max_concurrency()
    set_max(1)
    try:
        return work()
    finally:
        set_max(0)  # 0: TVM_NUM_THREADS again


def _set_max_concurrency():
    return runtime_function(_SET_MAX, (ctypes.c_int,))


class IdleCores:
    """Share of time the allowed cores other than one (the calling thread's) were idle since
    the last call, from /proc/stat; 0 where it cannot be read (then the pool is not tried).

    /proc/stat is read at most every _LOOK_SECONDS: the kernel writes the whole file (every
    interrupt's count) for each read, which costs more than a small model's run, and fewer
    than _MIN_JIFFIES a core since the last look cannot tell anyway."""

    def __init__(self, clock=time.perf_counter):
        self.cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.clock = clock
        self.looked = clock()
        self.last = self._read()

    def mostly_idle(self) -> bool:
        if self.clock() - self.looked < _LOOK_SECONDS:
            return False
        self.looked = self.clock()
        now = self._read()
        if not now or not self.last or len(self.cores) < 2:
            return False
        idle = sum(now[c][0] - self.last[c][0] for c in now if c in self.last)
        total = sum(now[c][1] - self.last[c][1] for c in now if c in self.last)
        if total < _MIN_JIFFIES * len(self.cores):
            return False  # too short a time to tell (jiffies are 10 ms): keep measuring
        self.last = now
        # our own thread keeps one core busy: the others' idle share
        others = (len(self.cores) - 1) / len(self.cores)
        return idle / total >= _IDLE_ENOUGH * others

    def restart(self) -> None:
        self.looked = self.clock()
        self.last = self._read()

    def _read(self) -> dict[int, tuple[int, int]]:
        """core -> (idle jiffies, all jiffies)."""
        try:
            with open("/proc/stat", encoding="ascii") as f:
                lines = [line.split() for line in f if line.startswith("cpu")]
        except OSError:
            return {}
        out = {}
        for fields in lines:
            if fields[0] == "cpu" or int(fields[0][3:]) not in self.cores:
                continue
            values = [int(v) for v in fields[1:]]
            out[int(fields[0][3:])] = (values[3] + values[4], sum(values[:8]))
        return out
