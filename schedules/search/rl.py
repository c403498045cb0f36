"""Reinforcement-learning search: a learned policy edits the decisions of good traces.

A MetaSchedule ``PySearchStrategy`` over the same space as the evolutionary baseline (the
design spaces the task's space generator made; postprocessors applied to every candidate).
Each round:
1. episodes: start from a measured trace (the best ones more often), let the policy change
   1..max_steps decisions (policy.py), replay the trace on the kernel;
2. the cost model scores every replayed candidate and its start; the policy is pushed by the
   predicted speed-up (inner reward), weighted by how well the model has ranked measured
   candidates so far (0 while it ranks no better than chance, e.g. during its warm-up);
3. the best-scored unseen candidates are measured, with a share drawn at random (explore);
4. measured speed-ups over each episode's start are the outer reward (a failed build or run
   counts as -1).
The first round measures the design spaces as they are (the default rules' schedule is one
of them) plus episodes and fresh samples. The policy object is shared by every task of a run
(TuneContext clones share it), so what one kernel teaches carries to the next."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate, PySearchStrategy
from tvm.s_tir.schedule import ScheduleError, Trace

from ..measure import measured_seconds
from .decisions import decisions
from .policy import Policy, clipped_log_ratio

# Errors a replayed trace can raise when an edited decision is invalid for the kernel.
REPLAY_ERRORS = (ScheduleError, ValueError, IndexError, RuntimeError)


@dataclass
class SearchStats:
    """Shared by the clones of one run; tune.py reports it. The ranking counts are filled by
    schedules/ranking.py (for either search)."""
    policy: Policy = field(default_factory=Policy)
    ranked_pairs: int = 0      # measured pairs the cost model's prediction ordered
    correct_pairs: int = 0     # ... the same way as the measurement
    episodes: int = 0
    invalid: int = 0

    @property
    def ranking_accuracy(self) -> float | None:
        return self.correct_pairs / self.ranked_pairs if self.ranked_pairs else None


@dataclass
class _Proposal:
    sch: object
    steps: list
    start_seconds: float | None
    score: float = 0.0


@derived_object
class RLSearch(PySearchStrategy):
    def __init__(self, stats: SearchStats | None = None, *, episodes: int = 96,
                 max_steps: int = 3, explore: float = 0.2):
        super().__init__()
        self.stats = stats if stats is not None else SearchStats()
        self.episodes, self.max_steps, self.explore = episodes, max_steps, explore

    def _initialize_with_tune_context(self, context) -> None:
        self.context = context
        self.postprocs = list(context.space_generator.postprocs)
        self.rng = random.Random(int(context.rand_state))

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                   cost_model=None) -> None:
        self.max_trials, self.per_round = int(max_trials), int(num_trials_per_iter)
        self.spaces = [space.trace for space in design_spaces]
        self.cost_model = cost_model
        self.trials = 0
        self.measured: list[tuple[Trace, float]] = []
        self.seen: set[int] = set()
        self.pending: list[_Proposal] = []
        self._resume(database)

    def post_tuning(self) -> None:
        self.pending = []

    def generate_measure_candidates(self):
        if self.trials >= self.max_trials or not self.spaces:
            return None
        count = min(self.per_round, self.max_trials - self.trials)
        first = [] if self.measured else self._design_spaces()
        chosen = first[:count] + self._choose(self._episodes(), count - len(first[:count]))
        chosen += self._fresh_samples(count - len(chosen))
        self.pending = chosen
        return [MeasureCandidate(p.sch, ms.arg_info.ArgInfo.from_entry_func(p.sch.mod, True))
                for p in chosen] or None

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.trials += len(measure_candidates)
        best = min((s for _, s in self.measured), default=None)
        episodes = []
        for proposal, result in zip(self.pending, results):
            seconds = measured_seconds(result)
            if seconds is not None:
                self.measured.append((proposal.sch.trace, seconds))
            if proposal.steps:
                before = proposal.start_seconds or best or seconds
                reward = -1.0 if seconds is None else clipped_log_ratio(before, seconds)
                episodes.append((proposal.steps, reward))
        self.stats.policy.reinforce(episodes, "measured")
        self.measured.sort(key=lambda item: item[1])
        self.pending = []

    def clone(self):
        return RLSearch(self.stats, episodes=self.episodes, max_steps=self.max_steps,
                        explore=self.explore)

    # --- rounds ---------------------------------------------------------------------------

    def _design_spaces(self) -> list[_Proposal]:
        return self._unseen([_Proposal(self._replay(t), [], None) for t in self.spaces])

    def _episodes(self) -> list[_Proposal]:
        """Run the policy from measured starts; score all with the cost model; push the
        policy by the predicted speed-ups."""
        starts = self._starts()
        if not starts:
            return []
        proposals, start_of = [], []
        for _ in range(self.episodes):
            index = min(int(self.rng.expovariate(1 / 3)), len(starts) - 1)  # best most often
            trace, seconds = starts[index]
            steps, edited = self._edit(trace)
            self.stats.episodes += 1
            if steps:
                sch = self._replay(edited)
                self.stats.invalid += sch is None
                proposals.append(_Proposal(sch, steps, seconds))
                start_of.append(index)
        self._score(proposals, starts, start_of)
        return self._unseen([p for p in proposals if p.sch is not None])

    def _edit(self, trace: Trace):
        steps = []
        for _ in range(self.rng.randint(1, self.max_steps)):
            picked = self.stats.policy.sample(decisions(trace), self.rng)
            if picked is None:
                break
            decision, move, step = picked
            trace = decision.apply(trace, move, self.rng)
            steps.append(step)
        return steps, trace

    def _score(self, proposals, starts, start_of) -> None:
        valid = [p for p in proposals if p.sch is not None]
        start_schs = [self._replay(trace) for trace, _ in starts]
        scores = self._predict([p.sch for p in valid] + [s for s in start_schs if s is not None])
        for proposal, score in zip(valid, scores):
            proposal.score = float(score)
        start_score = dict(zip([i for i, s in enumerate(start_schs) if s is not None],
                               scores[len(valid):]))
        trust = self._model_trust()
        inner = []
        for proposal, index in zip(proposals, start_of):
            if proposal.sch is None:
                inner.append((proposal.steps, -1.0))
            elif trust > 0 and index in start_score:
                reward = clipped_log_ratio(proposal.score, float(start_score[index]))
                inner.append((proposal.steps, -trust * reward))  # score: higher is faster
        self.stats.policy.reinforce(inner, "model")

    def _choose(self, proposals: list[_Proposal], count: int) -> list[_Proposal]:
        if count <= 0:
            return []
        ranked = sorted(proposals, key=lambda p: -p.score)
        exploit = int(round(count * (1 - self.explore)))
        chosen, rest = ranked[:exploit], ranked[exploit:]
        chosen += self.rng.sample(rest, min(count - len(chosen), len(rest)))
        return chosen

    def _fresh_samples(self, count: int) -> list[_Proposal]:
        out = []
        for _ in range(4 * max(count, 0)):
            if len(out) >= count:
                break
            space = self.rng.choice(self.spaces)
            out += self._unseen([_Proposal(self._replay(Trace(space.insts, {})), [], None)])
        return out

    # --- helpers --------------------------------------------------------------------------

    def _starts(self) -> list[tuple[Trace, float | None]]:
        if self.measured:
            return self.measured[:16]
        return [(trace, None) for trace in self.spaces]

    def _replay(self, trace: Trace):
        sch = tvm.s_tir.Schedule(self.context.mod, seed=self.rng.randint(1, 2**31 - 1), debug_mask=0,
                                 error_render_level="none")
        try:
            trace.apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()
            return sch if all(p.apply(sch) for p in self.postprocs) else None
        except REPLAY_ERRORS:
            return None

    def _unseen(self, proposals: list[_Proposal]) -> list[_Proposal]:
        out = []
        for proposal in proposals:
            if proposal.sch is None:
                continue
            key = tvm_ffi.structural_hash(proposal.sch.mod)
            if key not in self.seen:
                self.seen.add(key)
                out.append(proposal)
        return out

    def _predict(self, schs) -> list[float]:
        if not schs or self.cost_model is None:
            return [0.0] * len(schs)
        candidates = [MeasureCandidate(s, ms.arg_info.ArgInfo.from_entry_func(s.mod, True))
                      for s in schs]
        return [float(x) for x in self.cost_model.predict(self.context, candidates)]

    def _model_trust(self) -> float:
        """0 when the cost model orders measured pairs no better than chance, 1 when always."""
        accuracy = self.stats.ranking_accuracy
        return 0.0 if accuracy is None else max(0.0, 2.0 * accuracy - 1.0)

    def _resume(self, database) -> None:
        """Start from the records a database already holds for this kernel (a resumed run)."""
        if database is None or not database.has_workload(self.context.mod):
            return
        workload = database.commit_workload(self.context.mod)
        for record in database.get_top_k(workload, 16):
            seconds = measured_seconds(record)
            if seconds is not None:
                self.measured.append((record.trace, seconds))

