"""The auto-tuner, one module a role:
- tasks.py, keys.py: one task per distinct kernel of a compiled module, stable keys;
- space.py: MetaSchedule's design space united with the default rules' own;
- search/: the RL search (policy.py, decisions.py, rl.py) beside MetaSchedule's evolutionary;
- ranking.py: the cost model's (MetaSchedule's XGBModel) ranking of batches it has not seen;
- builder.py, intrinsics.py, measure.py: building in a warm worker pool, timing kernels;
- tune.py: the run (budget in trials or time, rounds, the best against the default rules);
- log.py, checkpoint.py, warm_state.py: append-only logs, records written as found, what the
  next run starts from; report.py: tables and tuning curves (aotc tune-report);
- apply.py: the schedule source compile asks first for every kernel.

Not built yet: a device-farm runner (the farm issue), a gain-driven task scheduler of our own
(MetaSchedule's gradient scheduler splits the budget)."""

from .apply import TunedSchedules
from .keys import target_key, workload_key
from .tasks import Task, extract_tasks

__all__ = ["Task", "TunedSchedules", "extract_tasks", "target_key", "workload_key"]
