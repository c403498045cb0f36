"""A live progress line while MetaSchedule measures: trials so far, trials per second, the
best time per task and the estimate of the model's kernel time (each kernel at its best so
far, or its default time while that is better; weighted by calls) against the untuned one
(MetaSchedule's own log goes to files only). It also keeps each task's tuning curve (best
time after each improvement), which the log records and ``aotc tune-report`` plots.

Each round of MetaSchedule's gradient task scheduler first generates and builds a batch for
every task and only then collects their measurements, so a first round over many tasks says
nothing for minutes. ``built`` fills that silence with the builder's count,
at most once per BUILT_EVERY_S."""

from __future__ import annotations

import time
from collections.abc import Callable

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from .measure import measured_seconds

BUILT_EVERY_S = 10.0


@derived_object
class ProgressLine(PyMeasureCallback):
    def __init__(self, names: list[str], weights: list[float], say: Callable[[str], None],
                 defaults: list[float]):
        super().__init__()
        self.names, self.weights, self.say, self.defaults = names, weights, say, defaults
        self.best: dict[int, float] = {}
        self.task_trials: dict[int, int] = {}
        # task -> [[trials of the task, trials of the run, best seconds so far], ...]
        self.curves: dict[int, list[list]] = {}
        # task -> the schedule trace (JSON) of each point of its curve: what the bench re-times
        self.curve_traces: dict[int, list] = {}
        self.trials, self.failed, self.start = 0, 0, time.perf_counter()
        self.built_count, self.last_built_line = 0, self.start

    def built(self, count: int) -> None:
        """The builder finished ``count`` candidates (PersistentBuilder's ``on_built``)."""
        self.built_count += count
        now = time.perf_counter()
        if now - self.last_built_line >= BUILT_EVERY_S:
            self.last_built_line = now
            self.say(f"built {self.built_count} candidates, {self.trials} measured so far "
                     "(a round builds a batch for every task before their results come in)")

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        for candidate, built, ran in zip(measure_candidates, builder_results, runner_results):
            self.trials += 1
            self.task_trials[task_id] = self.task_trials.get(task_id, 0) + 1
            seconds = measured_seconds(built, ran)
            if seconds is None:
                self.failed += 1
                continue
            if seconds < self.best.get(task_id, float("inf")):
                self.best[task_id] = seconds
                self.curves.setdefault(task_id, []).append(
                    [self.task_trials[task_id], self.trials, seconds])
                self.curve_traces.setdefault(task_id, []).append(candidate.sch.trace.as_json())
        elapsed = time.perf_counter() - self.start
        best = self.best.get(task_id)
        untuned = sum(w * d for w, d in zip(self.weights, self.defaults))
        estimate = sum(w * min(self.best.get(i, d), d)
                       for i, (w, d) in enumerate(zip(self.weights, self.defaults)))
        self.say(f"trial {self.trials} ({self.trials / max(elapsed, 1e-9):.2f}/s, "
                 f"{self.failed} failed): {self.names[task_id]} best "
                 + (f"{best * 1e3:.4f} ms" if best else "-")
                 + f"; all kernels {estimate * 1e3:.3f} ms vs untuned {untuned * 1e3:.3f} ms "
                 f"({len(self.best)}/{len(self.names)} tasks measured)")
