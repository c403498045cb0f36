"""Tune a module's kernels with MetaSchedule and keep what beats the default rules.

The search space is MetaSchedule's for the target (PostOrderApply with the target's schedule
rules, postprocessors and mutators) united with our default rules' own (space.py: the untuned
register tile is a point of it), searched by MetaSchedule's evolutionary strategy with its
XGBoost cost model, measured by its local builder and runner (each candidate in a worker process with
a timeout, so a candidate that fails to build, crashes or hangs is recorded as failed and the
tuner goes on). What is new here: the best schedule of each task is timed against the default
rules' schedule of the same kernel (compiler/lower), the same way, and both times go into the
log; compile applies a record only when it beat the default, so a log never makes a kernel
slower (as measured).

Not here yet (the tuner issue, in progress): decisions of the default rules beyond the
contraction's register tile, the RL search strategy, cost-model ranking reports, a gain-driven task scheduler beyond
MetaSchedule's gradient one, tuning-curve plots."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import tvm
from tvm.s_tir import meta_schedule as ms

from . import log as tuning_log
from .keys import target_key
from .measure import kernel_seconds
from .progress import ProgressLine
from .space import search_space
from .tasks import Task


# MetaSchedule's 30 s default timed every build out here while the machine was busy: each
# worker process imports TVM (and, through tvm_ffi, torch) before its first build.
BUILD_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 60.0


@dataclass
class TaskResult:
    task: str
    weight: int
    default_seconds: float
    tuned_seconds: float | None  # None: no valid candidate
    kept: bool


@dataclass
class TuneReport:
    trials: int
    seconds: float
    results: list[TaskResult] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{'task':44s} {'calls':>5s} {'default ms':>10s} {'tuned ms':>9s}  kept"]
        for r in self.results:
            tuned = f"{r.tuned_seconds * 1e3:9.4f}" if r.tuned_seconds else f"{'-':>9s}"
            out.append(f"{r.task[:44]:44s} {r.weight:5d} {r.default_seconds * 1e3:10.4f} "
                       f"{tuned}  {'yes' if r.kept else 'no'}")
        out.append(f"{self.trials} trials in {self.seconds:.0f} s "
                   f"({self.trials / max(self.seconds, 1e-9):.2f} trials/s)")
        return out


def tune(tasks: list[Task], target: tvm.target.Target, trials: int, log_path,
         default_schedule: Callable[[tvm.tirx.PrimFunc], tvm.tirx.PrimFunc], *,
         seed: int = 0, say: Callable[[str], None] = lambda _m: None) -> TuneReport:
    """Spend ``trials`` measurements over ``tasks`` (MetaSchedule's gradient task scheduler
    splits them by weight), then append a record for every task with a valid candidate: its
    best schedule's time and ``default_schedule(func)``'s time."""
    start = time.perf_counter()
    report = TuneReport(trials, 0.0)
    if not tasks:
        return report
    contexts = [ms.TuneContext(task_module(t.func), target=target,
                               space_generator=search_space(target),
                               search_strategy="evolutionary", task_name=t.name,
                               rand_state=seed + i, num_threads="physical").clone()
                for i, t in enumerate(tasks)]
    database = ms.database.MemoryDatabase()
    with tempfile.TemporaryDirectory(prefix="aotc-tune-") as work_dir:
        say(f"tuning {len(tasks)} tasks, {trials} trials")
        ms.tune_tasks(tasks=contexts, task_weights=[float(t.weight) for t in tasks],
                      work_dir=work_dir, max_trials_global=trials,
                      num_trials_per_iter=min(64, max(trials // len(tasks), 4)),
                      database=database, cost_model="xgb",
                      measure_callbacks=[
                          *ms.measure_callback.MeasureCallback.create("default"),
                          ProgressLine([t.name for t in tasks], [t.weight for t in tasks], say)],
                      builder=ms.builder.LocalBuilder(timeout_sec=BUILD_TIMEOUT_S),
                      runner=ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S))
    records = []
    for task in tasks:
        result, record = _best_against_default(task, target, database, default_schedule, trials)
        report.results.append(result)
        if record is not None:
            records.append(record)
        say(f"{task.name}: default {result.default_seconds * 1e3:.4f} ms, tuned "
            + (f"{result.tuned_seconds * 1e3:.4f} ms" if result.tuned_seconds else "none")
            + (" (kept)" if result.kept else ""))
    tuning_log.append(log_path, records)
    report.seconds = time.perf_counter() - start
    return report


def task_module(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    """The kernel as MetaSchedule tunes and replays it: alone, named ``main`` (without a
    global symbol, TVM's MakePackedAPI skips it and every candidate fails to build)."""
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def _best_against_default(task, target, database, default_schedule, trials):
    mod = task_module(task.func)
    default_seconds = kernel_seconds(default_schedule(task.func), target)
    workload = database.commit_workload(mod)
    best = database.get_top_k(workload, 1)
    if not best:
        return TaskResult(task.name, task.weight, default_seconds, None, False), None
    schedule = database.query_schedule(mod, target, workload_name="main")
    tuned_seconds = kernel_seconds(schedule.mod["main"], target)
    kept = tuned_seconds < default_seconds
    result = TaskResult(task.name, task.weight, default_seconds, tuned_seconds, kept)
    # logged either way (a resumed run skips the task); compile applies it only when faster
    record = tuning_log.Record(
        workload=task.key, target=target_key(target), task=task.name, seconds=tuned_seconds,
        default_seconds=default_seconds, trials=trials, trace=best[0].as_json(),
        tvm=tvm.__version__)
    return result, record
