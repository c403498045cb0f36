"""Reinforcement-learning search: a learned policy edits the decisions of good traces.

A MetaSchedule ``PySearchStrategy`` over the same space as the evolutionary baseline (the
design spaces the task's space generator made; postprocessors applied to every candidate).
Each round:
1. episodes (model-based rollouts): start from a measured trace of one design space, or one
   of the fresh samples of it the cost model scores best (each space gets its share of
   episodes; within a space the best traces more often), let the
   policy make 1..max_steps edits (policy.py: a decision's new value, or one of the space's
   mutators), replay the trace on the kernel; the cost model scores each edit, the policy
   is pushed by the predicted speed-up over the edit's parent (inner reward), weighted by
   how well the model has ranked measured candidates so far (0 while it ranks no better
   than chance, e.g. during its warm-up); the best-scored edits of each space are the next
   generation's starts (``generations`` of them);
2. fresh samples of every space (4 per candidate measured, 32-256) are scored beside the
   edits; the best ``sample_starts`` of each space are also starts of step 1;
3. the best-scored candidates not measured yet are measured, with a share drawn at random
   (explore); one scored in an earlier round and passed over may come back;
4. measured speed-ups over each episode's start are the outer reward (a failed build or run
   counts as -1).
The first round measures the design spaces as they are (the default rules' schedule is one
of them) plus episodes and fresh samples. The policy object is shared by every task of a run
(TuneContext clones share it), so what one kernel teaches carries to the next.

Why starts are kept per design space: the default rules' space is the fastest at first, so
with one shared list of best traces every episode would start there and the search stay in its
neighbourhood. Why fresh samples are scored and rollouts go several generations deep: the
evolutionary search ranks hundreds of samples and mutants with the cost model each round; one
generation of episodes gives the model ~100. Why the best-scored fresh samples are starts too:
MetaSchedule's spaces are large and their first measured traces poor; edits of those alone
stay near them. How RL and the evolutionary search compare: bench/tuning.py, and
docs/design/measurements.md#schedulessearchrlpy."""

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
from .decisions import decisions, mutator_edits
from .policy import Policy, clipped_log_ratio, model_reward

# Fresh samples scored per design space and round, per candidate the round measures, and
# the least (RLSearch._samples_per_space).
SAMPLES_PER_CANDIDATE, MIN_SAMPLES_PER_SPACE = 4, 32

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
    space: int                 # index of the design space the trace is from
    score: float = 0.0
    novel: bool = True         # never scored before this round
    key: int | None = None     # structural hash of its kernel (set by _unseen)


@dataclass
class _Start:
    """A trace episodes start from: a measured one, or an edit the cost model rated well."""
    trace: Trace
    seconds: float | None      # measured time of its measured root; None: not yet measured
    space: int
    steps: list = field(default_factory=list)   # edits since that measured root
    score: float | None = None  # the cost model's prediction


@derived_object
class RLSearch(PySearchStrategy):
    def __init__(self, stats: SearchStats | None = None, *, episodes: int = 96,
                 max_steps: int = 3, explore: float = 0.2, samples_per_space: int = 256,
                 generations: int = 3, sample_starts: int = 8):
        super().__init__()
        self.stats = stats if stats is not None else SearchStats()
        self.episodes, self.max_steps, self.explore = episodes, max_steps, explore
        self.samples_per_space, self.generations = samples_per_space, generations
        self.sample_starts = sample_starts

    def _initialize_with_tune_context(self, context) -> None:
        self.context = context
        self.postprocs = list(context.space_generator.postprocs)
        self.mutators = mutator_edits((context.space_generator.mutator_probs or {}).keys())
        self.rng = random.Random(int(context.rand_state))

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                   cost_model=None) -> None:
        self.max_trials, self.per_round = int(max_trials), int(num_trials_per_iter)
        self.spaces = [space.trace for space in design_spaces]
        self.cost_model = cost_model
        self.trials = 0
        self.measured: list[_Start] = []   # fastest first
        self.measured_keys: set[int] = set()   # kernels measured (or chosen to be)
        self.round_keys: set[int] = set()      # kernels proposed this round
        self.scored_keys: set[int] = set()     # kernels ever proposed
        self.spent: set[int] = set()   # design spaces whose episodes found nothing new
        self.pending: list[_Proposal] = []
        self._resume(database)

    def post_tuning(self) -> None:
        self.pending = []

    def generate_measure_candidates(self):
        if self.trials >= self.max_trials or not self.spaces:
            return None
        count = min(self.per_round, self.max_trials - self.trials)
        self._new_round()
        first = [] if self.measured else self._design_spaces()
        samples = self._scored(self._fresh_samples(
            self._samples_per_space() * len(self._sampled_spaces())))
        pool = self._episodes(self._sample_starts(samples)) + samples
        chosen = first[:count] + self._choose(pool, count - len(first[:count]))
        chosen += self._fresh_samples(count - len(chosen))
        self._mark_measured(chosen)
        self.pending = chosen
        return [MeasureCandidate(p.sch, ms.arg_info.ArgInfo.from_entry_func(p.sch.mod, True))
                for p in chosen] or None

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.trials += len(measure_candidates)
        best = self.measured[0].seconds if self.measured else None
        episodes = []
        for proposal, result in zip(self.pending, results):
            seconds = measured_seconds(result)
            if seconds is not None:
                self.measured.append(_Start(proposal.sch.trace, seconds, proposal.space))
            if proposal.steps:
                before = proposal.start_seconds or best or seconds
                reward = -1.0 if seconds is None else clipped_log_ratio(before, seconds)
                episodes.append((proposal.steps, reward))
        self.stats.policy.reinforce(episodes, "measured")
        self.measured.sort(key=lambda start: start.seconds)
        self.pending = []

    def clone(self):
        return RLSearch(self.stats, episodes=self.episodes, max_steps=self.max_steps,
                        explore=self.explore, samples_per_space=self.samples_per_space,
                        generations=self.generations, sample_starts=self.sample_starts)

    # --- rounds ---------------------------------------------------------------------------

    def _design_spaces(self) -> list[_Proposal]:
        return self._unseen([_Proposal(self._replay(t), [], None, i)
                             for i, t in enumerate(self.spaces)])

    def _episodes(self, extra_starts: list[_Start] = ()) -> list[_Proposal]:
        """Model-based rollouts: run the policy from the measured starts of each design
        space and from ``extra_starts`` (best-scored fresh samples), score every edit with
        the cost model (pushing the policy by the predicted speed-ups), then go on from the
        best-scored edits for ``generations`` rounds. Each edit keeps its steps back to its
        start, which the measurement rewards."""
        nodes = self._scored([start for group in self._starts() for start in group]) \
            + list(extra_starts)
        pool = []
        for _ in range(self.generations if nodes else 0):
            proposals, parents = self._rollouts(nodes)
            self._score(proposals, parents)
            valid = [p for p in proposals if p.sch is not None]
            pool += valid
            nodes = self._best_per_space(nodes + [_Start(p.sch.trace, p.start_seconds, p.space,
                                                         p.steps, p.score) for p in valid])
        fresh = self._unseen(pool)
        # a space whose edits gave nothing new this round (the default rules' spaces hold a
        # handful of points) gets no episodes next round: the others get its share
        self.spent = set(range(len(self.spaces))) - {p.space for p in fresh if p.novel}
        return fresh

    def _rollouts(self, nodes: list[_Start]) -> tuple[list[_Proposal], list[tuple[_Start, int]]]:
        """Episodes from ``nodes``, spaces in turn: the edits, and for each its (parent, how
        many steps this episode added)."""
        groups = [[n for n in nodes if n.space == space] for space in range(len(self.spaces))]
        groups = [g for g in groups if g and g[0].space not in self.spent] or \
            [g for g in groups if g]
        proposals, parents = [], []
        for episode in range(self.episodes):
            group = groups[episode % len(groups)]
            parent = group[min(int(self.rng.expovariate(1 / 3)), len(group) - 1)]
            steps, edited = self._edit(parent.trace)
            self.stats.episodes += 1
            if steps:
                sch = self._replay(edited)
                self.stats.invalid += sch is None
                proposals.append(_Proposal(sch, list(parent.steps) + steps, parent.seconds,
                                           parent.space))
                parents.append((parent, len(steps)))
        return proposals, parents

    def _edit(self, trace: Trace):
        steps = []
        for _ in range(self.rng.randint(1, self.max_steps)):
            picked = self.stats.policy.sample(decisions(trace) + self.mutators, self.rng)
            if picked is None:
                break
            decision, move, step = picked
            edited = decision.apply(trace, move, self.rng)
            if edited is None:  # a mutator that found nothing to change
                break
            trace = edited
            steps.append(step)
        return steps, trace

    def _score(self, proposals: list[_Proposal], parents) -> None:
        """Predict each edit; inner reward of its new steps: predicted speed-up over its
        parent (a replay failure: -1)."""
        valid = [p for p in proposals if p.sch is not None]
        for proposal, score in zip(valid, self._predict([p.sch for p in valid])):
            proposal.score = score
        trust = self._model_trust()
        inner = []
        for proposal, (parent, new) in zip(proposals, parents):
            steps = proposal.steps[-new:]
            if proposal.sch is None:
                inner.append((steps, -1.0))
            elif trust > 0 and parent.score is not None:
                inner.append((steps, model_reward(proposal.score, parent.score, trust)))
        self.stats.policy.reinforce(inner, "model")

    def _samples_per_space(self) -> int:
        """Fresh samples to score per design space this round: 4 per candidate a round
        measures (256 for rounds of 64, what bench/tuning.py measured), at least 32, at most
        ``samples_per_space``. Why not always the maximum: replaying and scoring 256 samples
        per space made the rounds of 4-8 candidates that short runs and the tests make about
        twice as slow, for a round that measures only a few of them."""
        return min(self.samples_per_space, max(MIN_SAMPLES_PER_SPACE,
                                               SAMPLES_PER_CANDIDATE * self.per_round))

    def _sample_starts(self, samples: list[_Proposal]) -> list[_Start]:
        """The best-scored fresh samples of each design space, as episode starts beside the
        measured traces. Why: in a large space (MetaSchedule's) the few measured traces of
        the first rounds are poor, and edits of them stay near them; the evolutionary search
        also mutates the random samples its cost model likes best."""
        if not self.sample_starts:
            return []
        return self._best_per_space([_Start(p.sch.trace, None, p.space, [], p.score)
                                     for p in samples], self.sample_starts)

    def _choose(self, proposals: list[_Proposal], count: int) -> list[_Proposal]:
        if count <= 0:
            return []
        ranked = sorted(proposals, key=lambda p: -p.score)
        exploit = int(round(count * (1 - self.explore)))
        chosen, rest = ranked[:exploit], ranked[exploit:]
        chosen += self.rng.sample(rest, min(count - len(chosen), len(rest)))
        return chosen

    def _sampled_spaces(self) -> list[int]:
        """The design spaces with decisions to sample. One without (an untuned schedule that
        is a candidate as it is: schedules/space.py) has one point, which the first round
        measures; sampling it again only replays that point and drops it as a duplicate."""
        return [i for i, trace in enumerate(self.spaces) if len(trace.decisions)]

    def _fresh_samples(self, count: int) -> list[_Proposal]:
        """Unseen random samples, spread evenly over the design spaces that have decisions."""
        out, spaces = [], self._sampled_spaces()
        for attempt in range(4 * max(count, 0) if spaces else 0):
            if len(out) >= count:
                break
            space = spaces[attempt % len(spaces)]
            trace = Trace(self.spaces[space].insts, {})
            out += self._unseen([_Proposal(self._replay(trace), [], None, space)])
        return out

    def _scored(self, items: list):
        """Set ``score`` on proposals (or starts, replayed first) from the cost model; a
        start that no longer replays is dropped."""
        if items and isinstance(items[0], _Start):
            schs = [self._replay(item.trace) for item in items]
            items = [item for item, sch in zip(items, schs) if sch is not None]
            schs = [sch for sch in schs if sch is not None]
        else:
            schs = [item.sch for item in items]
        for item, score in zip(items, self._predict(schs)):
            item.score = score
        return items

    def _best_per_space(self, nodes: list[_Start], per_space: int = 8) -> list[_Start]:
        ranked = sorted(nodes, key=lambda n: -(n.score if n.score is not None else -1e30))
        kept, count = [], {}
        for node in ranked:
            if count.get(node.space, 0) < per_space:
                kept.append(node)
                count[node.space] = count.get(node.space, 0) + 1
        return kept

    # --- helpers --------------------------------------------------------------------------

    def _starts(self, per_space: int = 8) -> list[list[_Start]]:
        """For each design space, its fastest measured traces (the space itself while none
        of it has been measured)."""
        groups = [[] for _ in self.spaces]
        for start in self.measured:
            if len(groups[start.space]) < per_space:
                groups[start.space].append(start)
        return [group or [_Start(self.spaces[i], None, i)] for i, group in enumerate(groups)]

    def _replay(self, trace: Trace):
        sch = tvm.s_tir.Schedule(self.context.mod, seed=self.rng.randint(1, 2**31 - 1),
                                 debug_mask=0,
                                 error_render_level="none")
        try:
            trace.apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()
            return sch if all(p.apply(sch) for p in self.postprocs) else None
        except REPLAY_ERRORS:
            return None

    def _unseen(self, proposals: list[_Proposal]) -> list[_Proposal]:
        """Proposals for kernels not measured yet, one per kernel within a round. A kernel
        scored in an earlier round and not chosen comes back when an episode reaches it
        again: the cost model that passed it over has been retrained since (dropped for good,
        the neighbourhood of the measured best would run dry within a few rounds, judged by
        the least-trained models). ``novel`` marks a kernel never scored before: a design space
        whose episodes find
        none is spent for the next round."""
        out = []
        for proposal in proposals:
            if proposal.sch is None:
                continue
            key = tvm_ffi.structural_hash(proposal.sch.mod)
            if key in self.measured_keys or key in self.round_keys:
                continue
            self.round_keys.add(key)
            proposal.key, proposal.novel = key, key not in self.scored_keys
            self.scored_keys.add(key)
            out.append(proposal)
        return out

    def _new_round(self) -> None:
        self.round_keys = set()

    def _mark_measured(self, proposals: list[_Proposal]) -> None:
        """Every proposal chosen for measurement came through _unseen, which hashed it."""
        self.measured_keys |= {p.key for p in proposals}

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
        for record in database.get_top_k(workload, 16 * len(self.spaces)):
            seconds = measured_seconds(record)
            if seconds is not None:
                self.measured.append(_Start(record.trace, seconds, self._space_of(record.trace)))

    def _space_of(self, trace: Trace) -> int:
        """The design space whose instructions a trace replays (postprocessing aside)."""
        kinds = _instruction_kinds(trace)
        for index, space in enumerate(self.spaces):
            if _instruction_kinds(space) == kinds:
                return index
        return 0


def _instruction_kinds(trace: Trace) -> tuple[str, ...]:
    kinds = []
    for inst in trace.insts:
        if inst.kind.name == "EnterPostproc":
            break
        kinds.append(inst.kind.name)
    return tuple(kinds)

