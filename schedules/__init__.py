"""The auto-tuner, one module a role:
- tasks.py, keys.py: one task per distinct kernel of a compiled module, stable keys;
- space.py: MetaSchedule's design space united with the default rules' own;
- search/: the RL search (policy.py, decisions.py, rl.py) beside MetaSchedule's evolutionary;
- ranking.py: the cost model's (MetaSchedule's XGBModel) ranking of batches it has not seen;
- builder.py, intrinsics.py, measure.py: building in a warm worker pool, timing kernels;
  retime.py: several schedules of one kernel timed side by side (bench/tuning.py's verdicts);
- tune.py: the run (budget in trials or time, rounds, the best against the default rules);
- log.py, checkpoint.py, warm_state.py: append-only logs, records written as found, what the
  next run starts from; report.py: tables and tuning curves (aotc tune-report);
- apply.py: the schedule source compile asks first for every kernel;
- runners.py, farm_target.py, remote.py: measuring here or on a device farm (TVM RPC tracker and
  servers), with a deadline on every remote step.

Not built yet: a gain-driven task scheduler of our own (MetaSchedule's gradient scheduler
splits the budget).

The names below are loaded on first use: ``aotc farm status`` imports farm_target.py alone, without
TVM (3 s)."""

from importlib import import_module

_LAZY = {"TunedSchedules": ".apply", "target_key": ".keys", "workload_key": ".keys",
         "Task": ".tasks", "extract_tasks": ".tasks"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Task", "TunedSchedules", "extract_tasks", "target_key", "workload_key"]
