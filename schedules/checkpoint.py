"""Checkpoint records: while the search runs, each new best of a task goes into the log at
once, so that a tuner killed at any point (SIGKILL, a lost machine) has lost no finished
measurement worth keeping.

A checkpoint is a Record with ``final=False``: its time is MetaSchedule's runner's, not yet
compared with the default rules in the same way, so compile does not apply it; a resumed run
(``aotc tune`` on the same log) commits it to the search's database, and both searches start
from the best they find there."""

from __future__ import annotations

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from . import log as tuning_log
from .keys import target_key
from .measure import measured_seconds, task_module


@derived_object
class CheckpointWriter(PyMeasureCallback):
    def __init__(self, tasks, target, log_path, default_seconds: list[float], search: str):
        super().__init__()
        self.tasks, self.target, self.log_path = tasks, target, log_path
        self.default_seconds, self.search = default_seconds, search
        self.best: dict[int, float] = {}

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        best = None
        for candidate, built, ran in zip(measure_candidates, builder_results, runner_results):
            seconds = measured_seconds(built, ran)
            if seconds is not None and seconds < self.best.get(task_id, float("inf")):
                self.best[task_id], best = seconds, (candidate, ran.run_secs)
        if best is not None:
            tuning_log.append(self.log_path, [self._record(task_id, *best)])

    def _record(self, task_id, candidate, run_secs) -> tuning_log.Record:
        task = self.tasks[task_id]
        workload = ms.database.Workload(candidate.sch.mod)
        record = ms.database.TuningRecord(candidate.sch.trace, workload, list(run_secs),
                                          self.target, candidate.args_info)
        return tuning_log.Record(
            workload=task.key, target=target_key(self.target), task=task.name,
            seconds=self.best[task_id], default_seconds=self.default_seconds[task_id],
            trials=0, trace=record.as_json(), tvm=tvm.__version__, search=self.search,
            calls=task.weight, final=False)


def commit_checkpoints(database, tasks, target, checkpoints: dict) -> int:
    """Put the checkpoint records of ``tasks`` (workload key -> Record) into ``database`` as
    tuning records of the task's kernel; returns how many."""
    count = 0
    for task in tasks:
        record = checkpoints.get(task.key)
        if record is None or record.tvm != tvm.__version__:
            continue
        workload = database.commit_workload(task_module(task.func))
        database.commit_tuning_record(
            ms.database.TuningRecord.from_json(record.trace, workload))
        count += 1
    return count
