"""The RL search's parts: moves on trace decisions keep tilings perfect and within bounds; a
rewarded move becomes likelier under REINFORCE (and a punished one less likely); the policy
survives a JSON round trip; the search run by MetaSchedule's task scheduler on a matmul finds
valid schedules and shares its policy across clones, and the ranking probe scores the cost
model on the batch it has not yet seen. The inner reward is positive for an edit the cost
model predicts faster; every design space gets its own starts; the space's mutators are
actions of the policy."""

import random

import numpy as np
import tvm
from test_tuning_space import _matmul
from tvm.s_tir import meta_schedule as ms

from aotc.schedules.builder import PersistentBuilder
from aotc.schedules.ranking import RankingProbe
from aotc.schedules.search import RLSearch, SearchStats, create
from aotc.schedules.search.decisions import CATEGORICAL, TILE, decisions
from aotc.schedules.search.policy import Policy, model_reward
from aotc.schedules.search.rl import _Proposal, _Start
from aotc.schedules.space import search_space
from aotc.targets import resolve

# candidates are built and run here: the host's own target
TARGET = tvm.target.Target(resolve("x86").tvm_target)


def _design_space_trace():
    mod = tvm.IRModule({"main": _matmul()})
    context = ms.TuneContext(mod, target=TARGET, space_generator=search_space(TARGET),
                             search_strategy="evolutionary", task_name="t", num_threads=2)
    spaces = context.space_generator.generate_design_space(mod)
    # MetaSchedule's first space (after the default rules'): it has tile decisions
    return next(s.trace for s in spaces
                if any(i.kind.name == "SamplePerfectTile" for i in s.trace.insts))


def test_tile_moves_keep_the_product_and_the_innermost_bound():
    trace, rng = _design_space_trace(), random.Random(0)
    for _ in range(200):
        options = [d for d in decisions(trace) if d.kind == TILE]
        decision = rng.choice(options)
        moves = [m for m in decision.moves() if decision.valid(m)]
        if not moves:
            continue
        trace = decision.apply(trace, rng.choice(moves), rng)
        after = next(d for d in decisions(trace) if d.which_key == decision.which_key)
        assert np.prod(after.value) == np.prod(decision.value)
        assert after.choices[1] <= 0 or after.value[-1] <= after.choices[1]


def test_categorical_moves_pick_another_candidate():
    trace = _design_space_trace()
    decision = next(d for d in decisions(trace) if d.kind == CATEGORICAL)
    assert not decision.valid((decision.value[0],))
    other = next(m for m in decision.moves() if decision.valid(m))
    moved = decision.apply(trace, other, random.Random(0))
    assert next(d for d in decisions(moved)
                if d.which_key == decision.which_key).value == other


def _probability_of(policy, options, target_key, rng, draws=400):
    hits = sum(policy.sample(options, rng)[0].which_key == target_key for _ in range(draws))
    return hits / draws


def test_reinforce_moves_probability_towards_rewarded_choices():
    options, rng = decisions(_design_space_trace()), random.Random(1)
    policy = Policy(learning_rate=0.5)
    favoured = options[0].which_key
    before = _probability_of(policy, options, favoured, rng)
    for _ in range(30):
        episodes = []
        for _ in range(8):
            decision, _move, step = policy.sample(options, rng)
            episodes.append(([step], 1.0 if decision.which_key == favoured else -1.0))
        policy.reinforce(episodes, "test")
    assert _probability_of(policy, options, favoured, rng) > before + 0.3


def test_inner_reward_favours_edits_the_model_predicts_faster():
    # scores: higher is faster (MetaSchedule's normalised throughput)
    assert model_reward(0.9, 0.6, trust=1.0) > 0
    assert model_reward(0.3, 0.6, trust=1.0) < 0
    assert model_reward(0.9, 0.6, trust=0.5) == 0.5 * model_reward(0.9, 0.6, trust=1.0)


def test_every_design_space_gets_starts_when_one_is_fastest():
    """Five fast traces of space 0 and two slow ones of space 1: space 1 still gets its own
    starts (a single best-16 list had sent every episode to the fastest space); space 2,
    never measured, starts from its design space."""
    search = RLSearch(SearchStats())
    search.spaces = ["space0", "space1", "space2"]
    search.measured = sorted([_Start(f"a{i}", 1.0 + i, 0) for i in range(5)]
                             + [_Start(f"b{i}", 10.0 + i, 1) for i in range(2)],
                             key=lambda s: s.seconds)
    groups = search._starts(per_space=3)
    assert [[s.trace for s in g] for g in groups] == [["a0", "a1", "a2"], ["b0", "b1"],
                                                      ["space2"]]
    assert groups[2][0].seconds is None


def _proposal_for_kernel(n: int, space: int = 0) -> _Proposal:
    """A proposal whose kernel is an n x n matmul (distinct n: distinct kernels)."""
    from types import SimpleNamespace

    from tvm import te
    a = te.placeholder((n, n), name="a")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * a[k, j], axis=k), name="c")
    module = tvm.IRModule({"main": te.create_prim_func([a, c])})
    return _Proposal(SimpleNamespace(mod=module, n=n), [], None, space)


def test_a_kernel_scored_and_passed_over_comes_back_but_a_measured_one_never():
    """Within a round a kernel is proposed once. A kernel scored and not chosen comes back
    in a later round (the retrained model may rank it higher); a measured one never does.
    ``novel``: never scored before (what decides that a design space is spent)."""
    search = RLSearch(SearchStats())
    search.measured_keys, search.round_keys, search.scored_keys = set(), set(), set()
    first = search._unseen([_proposal_for_kernel(8), _proposal_for_kernel(8),
                            _proposal_for_kernel(16)])
    assert len(first) == 2 and all(p.novel for p in first)
    search._mark_measured(first[:1])        # the 8x8 kernel was measured, the 16x16 not

    search._new_round()
    again = search._unseen([_proposal_for_kernel(8), _proposal_for_kernel(16),
                            _proposal_for_kernel(32)])
    assert [p.sch.n for p in again] == [16, 32]
    assert [p.novel for p in again] == [False, True]


def test_policy_round_trips_through_json():
    policy = Policy(which={"SamplePerfectTile#0": 0.5}, move={"k": [0.1, -0.2]},
                    baseline={"measured": 0.3}, updates=4)
    again = Policy.from_json(policy.to_json())
    assert (again.which, again.move, again.baseline, again.updates) == \
        (policy.which, policy.move, policy.baseline, policy.updates)


def test_both_searches_are_selectable_by_name():
    assert isinstance(create("rl", SearchStats()), RLSearch)
    assert create("evolutionary") == "evolutionary"
    import pytest
    with pytest.raises(ValueError, match="unknown search"):
        create("annealing")


def test_rl_search_tunes_a_matmul(tmp_path):
    """tune_tir clones the TuneContext (and so the strategy): the stats passed in still fill,
    so clones share one policy."""
    mod = tvm.IRModule({"main": _matmul()})
    stats = SearchStats()
    builder = PersistentBuilder(timeout_sec=120)
    cost_model = ms.cost_model.XGBModel(num_warmup_samples=8)
    try:
        database = ms.tune_tir(
            mod, TARGET, str(tmp_path), max_trials_global=16, num_trials_per_iter=8,
            space=search_space(TARGET), builder=builder, seed=0,
            # few fresh samples, so that edits (what the policy learns from) get measured
            strategy=RLSearch(stats, episodes=32, samples_per_space=8),
            cost_model=cost_model, measure_callbacks=[
                RankingProbe(cost_model, stats),
                *ms.measure_callback.MeasureCallback.create("default")])
    finally:
        builder.shutdown()
    records = database.get_all_tuning_records()
    assert len(records) == 16
    assert sum(bool(r.run_secs) for r in records) >= 12  # nearly all candidates ran
    assert stats.episodes > 0 and stats.policy.updates > 0
    # MetaSchedule's mutators were offered to the policy as actions (and pushed by rewards)
    assert any(key.startswith("Mutator/Mutate") for key in stats.policy.which)
    # the model trained on the first batch of 8 and ranked the second before retraining
    assert stats.ranked_pairs > 0 and 0.0 <= stats.ranking_accuracy <= 1.0


def test_the_best_scored_fresh_samples_of_each_space_become_episode_starts():
    """Episodes start also from the random samples the cost model likes best, per design
    space (as the evolutionary search mutates its best-scored samples): the two best of each
    space, unmeasured (no time), with their scores; none when sample starts are off."""
    from types import SimpleNamespace

    def sample(name, space, score):
        proposal = _Proposal(SimpleNamespace(trace=name), [], None, space)
        proposal.score = score
        return proposal

    samples = [sample("a", 0, 0.1), sample("b", 0, 0.9), sample("c", 0, 0.5),
               sample("d", 1, 0.2), sample("e", 1, 0.3), sample("f", 2, 0.05)]
    search = RLSearch(SearchStats(), sample_starts=2)
    starts = search._sample_starts(samples)
    assert sorted((s.space, s.trace) for s in starts) == [(0, "b"), (0, "c"), (1, "d"),
                                                          (1, "e"), (2, "f")]
    assert all(s.seconds is None and s.steps == [] for s in starts)
    assert next(s for s in starts if s.trace == "b").score == 0.9
    assert RLSearch(SearchStats(), sample_starts=0)._sample_starts(samples) == []


def test_fresh_samples_per_space_scale_with_the_round():
    search = RLSearch(SearchStats())
    for per_round, expected in [(4, 32), (8, 32), (32, 128), (64, 256), (128, 256)]:
        search.per_round = per_round
        assert search._samples_per_space() == expected
    small = RLSearch(SearchStats(), samples_per_space=8)
    small.per_round = 64
    assert small._samples_per_space() == 8


def test_fresh_samples_come_only_from_spaces_with_decisions():
    """A design space without decisions (an untuned schedule as it is) has one point: the
    first round measures it, and fresh samples are drawn from the other spaces only."""
    from types import SimpleNamespace
    search = RLSearch(SearchStats())
    sampled = _design_space_trace()
    fixed = SimpleNamespace(decisions={}, insts=[])
    search.spaces = [fixed, sampled, fixed]
    assert search._sampled_spaces() == [1]
    drawn = []
    search._replay = lambda trace: trace
    search._unseen = lambda proposals: drawn.extend(p.space for p in proposals) or proposals
    assert len(search._fresh_samples(6)) == 6 and set(drawn) == {1}
    search.spaces = [fixed]
    assert search._fresh_samples(6) == []
