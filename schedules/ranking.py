"""How well the cost model ranks candidates it has not seen: before each batch's results
update the model, its predictions for that batch are compared with the measured times
(pairwise: did it order each pair of candidates the way they ran?).

Runs as a measure callback placed before MetaSchedule's own (which retrain the model), for
either search, so the report's figure means the same for both. Predictions made during the
model's warm-up (random numbers until it has trained) are not counted. The RL search reads the
figure to decide how far to trust the model's scores."""

from __future__ import annotations

import itertools

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from .measure import measured_seconds


@derived_object
class RankingProbe(PyMeasureCallback):
    def __init__(self, cost_model, stats):
        super().__init__()
        self.cost_model, self.stats = cost_model, stats

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        if getattr(self.cost_model, "booster", None) is None:
            return  # still warming up: its predictions are random
        timed = [(candidate, measured_seconds(built, ran)) for candidate, built, ran
                 in zip(measure_candidates, builder_results, runner_results)]
        timed = [(c, s) for c, s in timed if s is not None]
        if len(timed) < 2:
            return
        context = task_scheduler.tasks_[task_id].ctx
        scores = self.cost_model.predict(context, [c for c, _ in timed])
        for (score_a, (_, secs_a)), (score_b, (_, secs_b)) in itertools.combinations(
                zip(scores, timed), 2):
            if score_a != score_b and secs_a != secs_b:
                self.stats.ranked_pairs += 1
                self.stats.correct_pairs += bool((score_a > score_b) == (secs_a < secs_b))


