"""Tune a module's kernels and keep what beats the default rules.

The search space is MetaSchedule's for the target (PostOrderApply with the target's schedule
rules, postprocessors and mutators) united with our default rules' own (space.py: the untuned
register tile is a point of it). It is searched by our RL search or MetaSchedule's
evolutionary one (search/, ``--search``), both ranking candidates with MetaSchedule's XGBoost
cost model, both measured by MetaSchedule's local builder and runner (each candidate in a
worker process with a timeout, so a candidate that fails to build, crashes or hangs is
recorded as failed and the tuner goes on). A time budget runs the search in rounds over one
database until the time is spent. What is new here: the best few schedules of each task
are timed in turn with the default rules' schedule of the same kernel (compiler/default_schedules),
the
fastest median kept, and both times go into the log with the task's tuning curve; compile
applies a record only when it beat the default, so a log never makes a kernel slower (as
measured).

Candidates and the reference measurements run on this machine or on a device farm's servers
(runners.py). Not here yet: decisions of the default rules beyond the contraction's, a
gain-driven task scheduler beyond MetaSchedule's gradient one."""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import ScheduleError

from . import log as tuning_log
from . import runners, warm_state
from . import search as search_strategy
from .builder import PersistentBuilder
from .checkpoint import CheckpointWriter, commit_checkpoints
from .intrinsics import register_cpu_intrinsics
from .keys import schedule_key, target_key
from .measure import same_values, task_module
from .progress import ProgressLine
from .ranking import RankingProbe
from .search import SearchStats
from .space import search_space
from .tasks import Task

# MetaSchedule's 30 s default timed every build out here while the machine was busy: each
# worker process imports TVM (and, through tvm_ffi, torch) before its first build.
BUILD_TIMEOUT_S = 120.0


# XGBModel trains after this many measurements (MetaSchedule's default, 100, left budgets of
# 32-64 trials a task ranked at random throughout).
COST_MODEL_WARMUP = 24
# Best candidates (by their in-run time) checked against the default schedule's results
# before one is logged; of those that compute the same, up to FINAL_CANDIDATES are timed in
# turn with the default for FINAL_ROUNDS rounds, and the fastest median is the task's record.
# An in-run best is the minimum of many noisy single timings and often a lucky one.
TOP_K = 4
FINAL_CANDIDATES = 3
FINAL_ROUNDS = 7
# Candidates a search measures per iteration of a task (MetaSchedule's batch): its cost model
# retrains and the RL policy learns from measurements between iterations.
TRIALS_PER_ITER = 64
# A time budget runs the search in rounds of this many trials per task.
ROUND_TRIALS_PER_TASK = 32


@dataclass
class Budget:
    trials: int | None = None      # measurements in all
    seconds: float | None = None   # wall-clock time for the search

    def __post_init__(self):
        if self.trials is None and self.seconds is None:
            raise ValueError("a tuning budget needs trials, a time, or both")


@dataclass
class TaskResult:
    task: str
    weight: int
    default_seconds: float
    tuned_seconds: float | None  # None: no valid candidate
    kept: bool
    curve: list = field(default_factory=list)
    wrong: int = 0  # best candidates rejected: their results differed from the default's
    curve_traces: list = field(default_factory=list)  # the trace (JSON) of each curve point
    picked: int = 0  # rank by in-run time of the candidate the final timing kept (0: the best)


@dataclass
class TuneReport:
    trials: int
    seconds: float
    search: str = "evolutionary"
    ranking_accuracy: float | None = None  # cost model, on measurements it had not seen
    results: list[TaskResult] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{'task':44s} {'calls':>5s} {'default ms':>10s} {'tuned ms':>9s}  kept"]
        for r in self.results:
            tuned = f"{r.tuned_seconds * 1e3:9.4f}" if r.tuned_seconds else f"{'-':>9s}"
            out.append(f"{r.task[:44]:44s} {r.weight:5d} {r.default_seconds * 1e3:10.4f} "
                       f"{tuned}  {'yes' if r.kept else 'no'}")
        wrong = sum(r.wrong for r in self.results)
        if wrong:
            out.append(f"{wrong} best candidates rejected: results differed from the default "
                       "schedule's")
        repicked = sum(1 for r in self.results if r.tuned_seconds and r.picked)
        if repicked:
            out.append(f"{repicked} tasks kept another candidate than their in-run best: "
                       "timed side by side with it, it was faster")
        out.append(f"{self.trials} trials ({self.search} search) in {self.seconds:.0f} s "
                   f"({self.trials / max(self.seconds, 1e-9):.2f} trials/s)")
        if self.ranking_accuracy is not None:
            out.append(f"cost model ranked {self.ranking_accuracy:.0%} of measured pairs "
                       "right before measuring them")
        return out


def tune(tasks: list[Task], target: tvm.target.Target, budget: Budget, log_path,
         default_schedule: Callable[[tvm.tirx.PrimFunc], tvm.tirx.PrimFunc], *,
         search: str = "evolutionary", seed: int = 0, checkpoints: dict | None = None,
         measurement=None, say: Callable[[str], None] = lambda _m: None) -> TuneReport:
    """Spend ``budget`` over ``tasks`` (MetaSchedule's gradient task scheduler splits it by
    weight), then append a record for every task with a valid candidate: its best
    schedule's time and ``default_schedule(func)``'s time. Each new best is checkpointed
    to the log as it is found; ``checkpoints`` (workload key -> Record, from an earlier run
    that was stopped) are where the search starts. ``measurement`` (runners.create) says
    where candidates and references are timed: this machine by default, or a device farm."""
    start = time.perf_counter()
    measurement = measurement or runners.LocalMeasurement()
    report = TuneReport(0, 0.0, search)
    if not tasks:
        return report
    try:
        run = _Run.start(tasks, target, log_path, default_schedule, search, checkpoints,
                         measurement, say)
        return _tune(run, budget, seed, start, report)
    finally:
        measurement.close()


def _tune(run: _Run, budget: Budget, seed: int, start: float, report: TuneReport) -> TuneReport:
    tasks, target, log_path, search, say = run.tasks, run.target, run.log_path, run.search, run.say
    with warnings.catch_warnings():
        # XGBModel saves its booster on every retrain; xgboost warns about the format each time
        warnings.filterwarnings("ignore", message=".*UBJSON format.*")
        _spend(budget, run, search, seed, start)
        warm_state.save(run.cost_model, run.stats.policy, log_path)
    report.trials = run.progress.trials
    report.ranking_accuracy = run.stats.ranking_accuracy
    for task_id, task in enumerate(tasks):
        result, record = _best_against_default(task, target, run.database,
                                               run.default_schedule, run.progress, task_id,
                                               search, run.measurement)
        report.results.append(result)
        if record is not None:  # each as soon as it is known: a failure later keeps it
            tuning_log.append(log_path, [record])
        say(f"{task.name}: default {result.default_seconds * 1e3:.4f} ms, tuned "
            + (f"{result.tuned_seconds * 1e3:.4f} ms" if result.tuned_seconds else "none")
            + (" (kept)" if result.kept else ""))
    report.seconds = time.perf_counter() - start
    return report


@dataclass
class _Run:
    """What one tuning run keeps across its rounds: one database, one cost model (warm from
    the log's state when there is one), one search state, warm builder and runner pools, and
    the measure callbacks (ranking probe first: it must see each batch before the model
    retrains on it)."""
    tasks: list
    target: tvm.target.Target
    database: object
    cost_model: object
    stats: SearchStats
    progress: ProgressLine
    callbacks: list
    builder: PersistentBuilder
    runner: object
    log_path: object
    default_schedule: Callable
    search: str
    measurement: object
    say: Callable[[str], None]

    @classmethod
    def start(cls, tasks, target, log_path, default_schedule, search, checkpoints,
              measurement, say):
        register_cpu_intrinsics()
        cost_model = ms.cost_model.XGBModel(num_warmup_samples=COST_MODEL_WARMUP)
        policy, warm = warm_state.load(cost_model, log_path)
        stats = SearchStats(policy) if policy is not None else SearchStats()
        if warm or policy is not None:
            say(f"warm start: cost model with {warm} measurements"
                + (f", policy after {policy.updates} updates" if policy else ""))
        database = ms.database.MemoryDatabase()
        resumed = commit_checkpoints(database, tasks, target, checkpoints or {})
        if resumed:
            say(f"resuming {resumed} tasks from checkpoints in {log_path}")
        say(f"measuring on {measurement.describe()}")
        defaults = [measurement.kernel_seconds(default_schedule(t.func), target) for t in tasks]
        progress = ProgressLine([t.name for t in tasks], [t.weight for t in tasks], say,
                                defaults)
        callbacks = [RankingProbe(cost_model, stats),
                     *ms.measure_callback.MeasureCallback.create("default"), progress,
                     CheckpointWriter(tasks, target, log_path, defaults, search)]
        say(f"tuning {len(tasks)} tasks ({search} search)")
        return cls(tasks, target, database, cost_model, stats, progress, callbacks,
                   PersistentBuilder(BUILD_TIMEOUT_S, on_built=progress.built,
                                     **measurement.builder_options()),
                   measurement.runner(), log_path, default_schedule, search, measurement, say)

    def search_round(self, trials: int, strategy, seed: int) -> None:
        contexts = [ms.TuneContext(task_module(t.func), target=self.target,
                                   space_generator=search_space(self.target, t.func),
                                   search_strategy=strategy, task_name=t.name,
                                   rand_state=seed + i, num_threads="physical").clone()
                    for i, t in enumerate(self.tasks)]
        with tempfile.TemporaryDirectory(prefix="aotc-tune-") as work_dir:
            ms.tune_tasks(tasks=contexts, task_weights=[float(t.weight) for t in self.tasks],
                          work_dir=work_dir, max_trials_global=trials,
                          num_trials_per_iter=min(TRIALS_PER_ITER,
                                                  max(trials // len(self.tasks), 4)),
                          database=self.database, cost_model=self.cost_model,
                          measure_callbacks=self.callbacks, builder=self.builder,
                          runner=self.runner)


def _spend(budget: Budget, run: _Run, search: str, seed: int, start: float) -> None:
    """Search in rounds until the budget is spent (one round for a trial budget)."""
    try:
        while True:
            trials = _round_trials(budget, run.progress.trials, len(run.tasks),
                                   time.perf_counter() - start)
            if trials <= 0:
                break
            before = run.progress.trials
            run.search_round(trials, search_strategy.create(search, run.stats), seed + before)
            if budget.seconds is None or run.progress.trials == before:
                break  # a round that measured nothing: the space is exhausted
    finally:
        run.builder.shutdown()


def _round_trials(budget: Budget, done: int, tasks: int, elapsed: float) -> int:
    """Trials for the next round: what the trial budget leaves, and under a time budget no
    more than the measured rate fits in the time left (the first round is a short probe)."""
    left = budget.trials - done if budget.trials is not None else None
    if budget.seconds is None:
        return left
    remaining = budget.seconds - elapsed
    if remaining <= 0:
        return 0
    fits = int(done / elapsed * remaining) if done else 4 * tasks
    per_round = max(4, min(ROUND_TRIALS_PER_TASK * tasks, fits))
    return per_round if left is None else min(left, per_round)


def _best_against_default(task, target, database, default_schedule, progress, task_id,
                          search, measurement):
    """The task's fastest candidate that computes what the default schedule computes: the
    best few by in-run time (TOP_K checked, FINAL_CANDIDATES kept) timed in turn with the
    default, fastest median first; and its record."""
    default_func = default_schedule(task.func)
    candidates, wrong = _valid_candidates(task, database, default_func, target, measurement)
    if not candidates:
        return TaskResult(task.name, task.weight,
                          measurement.kernel_seconds(default_func, target), None, False,
                          wrong=wrong), None
    kernels = {"default": default_func}
    kernels.update((f"candidate{rank}", func) for rank, (_, func) in enumerate(candidates))
    medians = measurement.compare(kernels, target, FINAL_ROUNDS)
    picked = min(range(len(candidates)), key=lambda rank: medians[f"candidate{rank}"])
    default_seconds, tuned_seconds = medians["default"], medians[f"candidate{picked}"]
    curve = progress.curves.get(task_id, [])
    kept = tuned_seconds < tuning_log.APPLY_MARGIN * default_seconds
    result = TaskResult(task.name, task.weight, default_seconds, tuned_seconds, kept, curve,
                        wrong, progress.curve_traces.get(task_id, []), picked)
    # logged either way (a resumed run skips the task); compile applies it only when faster
    record = tuning_log.Record(
        workload=task.key, target=target_key(target), task=task.name, seconds=tuned_seconds,
        default_seconds=default_seconds, trials=progress.task_trials.get(task_id, 0),
        trace=candidates[picked][0].as_json(), tvm=tvm.__version__, search=search,
        curve=curve, calls=task.weight, default_schedule=schedule_key(default_func))
    return result, record


def _valid_candidates(task, database, default_func, target, measurement):
    """([(record, scheduled kernel)] best first, up to FINAL_CANDIDATES, among the TOP_K
    fastest measured; how many of those were rejected: failed to replay or computed
    something else than the default)."""
    mod = task_module(task.func)
    workload = database.commit_workload(mod)
    candidates, wrong, want = [], 0, None
    for record in database.get_top_k(workload, TOP_K):
        scheduled = _replay(mod, record)
        if scheduled is not None and want is None:  # the default run once, when needed
            want = measurement.outputs(default_func, target)
        if scheduled is None or not same_values(measurement.outputs(scheduled, target), want):
            wrong += 1
            continue
        candidates.append((record, scheduled))
        if len(candidates) == FINAL_CANDIDATES:
            break
    return candidates, wrong


def _replay(mod: tvm.IRModule, record) -> tvm.tirx.PrimFunc | None:
    sch = tvm.s_tir.Schedule(mod)
    try:
        record.trace.apply_to_schedule(sch, remove_postproc=False)
    except ScheduleError:
        return None
    return sch.mod["main"]
