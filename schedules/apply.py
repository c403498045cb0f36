"""Compile with tuning logs: the schedule source compiler/default_schedules asks first for every
kernel.

``TunedSchedules(paths, target).schedule_for(func, target, default)`` returns the kernel with
the best logged schedule replayed (MetaSchedule's trace, through its in-memory database), or
None when no record matches the kernel's workload key and the target's ISA, the record was
written by another TVM version, or the default rules now schedule the kernel otherwise than the
schedule the record was timed against (``default()``, compared by keys.schedule_key: the
record's "beats the default" is then stale, and a tuned kernel must never be slower than the
default one); compiler/default_schedules then uses its default rules. The compiler sees only this
method
(it does not import schedules/)."""

from __future__ import annotations

import logging

import tvm
from tvm.s_tir import meta_schedule as ms

from .keys import schedule_key, target_key, workload_key
from .log import best_records
from .measure import task_module

LOG = logging.getLogger("aotc.tuning")


class TunedSchedules:
    def __init__(self, paths, target: tvm.target.Target):
        self.records = best_records(paths, target_key(target))
        # every final record, kept or not: both times were measured, so the log knows how
        # long the kernel runs whichever schedule compile picks
        self.timings = best_records(paths, target_key(target), beating_default=False)

    def estimated_seconds(self, func: tvm.tirx.PrimFunc) -> float | None:
        """What the log measured for the schedule compile will use: the tuned time where a
        record applies, else the default rules' time; None when the log never saw the kernel."""
        key = workload_key(func)
        if key in self.records:
            return self.records[key].seconds
        record = self.timings.get(key)
        return record.default_seconds if record is not None else None

    def schedule_for(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, default=None):
        """``default``: a function returning the default rules' schedule of ``func`` (or None)."""
        key = workload_key(func)
        record = self.records.get(key)
        if record is None:
            return None
        if record.tvm != tvm.__version__:
            LOG.warning("tuning record for %s is from TVM %s, this is %s: default schedule",
                        record.task, record.tvm, tvm.__version__)
            return None
        if record.default_schedule and default is not None:
            scheduled = default()
            if scheduled is not None and schedule_key(scheduled) != record.default_schedule:
                LOG.warning("tuning record for %s was timed against other default rules than "
                            "this aotc's: default schedule (re-tune to use the log)", record.task)
                self.records.pop(key)  # its estimate is stale too
                return None
        mod = task_module(func)
        database = ms.database.MemoryDatabase()
        workload = database.commit_workload(mod)
        database.commit_tuning_record(ms.database.TuningRecord.from_json(record.trace, workload))
        schedule = database.query_schedule(mod, target, workload_name="main")
        if schedule is None:
            return None
        scheduled = schedule.mod["main"]
        name = func.attrs.get("global_symbol") if func.attrs is not None else None
        return scheduled.with_attr("global_symbol", name) if name else \
            scheduled.without_attr("global_symbol")
