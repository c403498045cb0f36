"""The auto-tuner: tasks from a compiled module (tasks.py), stable keys (keys.py), MetaSchedule
search measured against the default rules (tune.py, measure.py), append-only tuning logs
(log.py) and the schedule source compile uses (apply.py).

In progress (the tuner issue): our default rules as a search space of their own, the RL
search, cost-model reports, plots, a device-farm runner, shipped logs."""

from .apply import TunedSchedules
from .keys import target_key, workload_key
from .tasks import Task, extract_tasks

__all__ = ["Task", "TunedSchedules", "extract_tasks", "target_key", "workload_key"]
