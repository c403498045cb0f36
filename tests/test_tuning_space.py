"""The tuner's search space: MetaSchedule's design space united with the default rules' own,
in which the untuned register tile is the default decision; kernels that are not contractions
get MetaSchedule's space plus their untuned schedule as a space without decisions (so that it
stays a candidate); a schedule drawn from the default-rules space computes the same numbers."""

import numpy as np
import pytest
import tvm
from kernel_helpers import skip_unless_runs_here
from relax_helpers import attention_module
from tvm import te, topi
from tvm.s_tir import meta_schedule as ms

from aotc.schedules.space import default_rules_space, search_space

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})


def _matmul():
    a, b = te.placeholder((64, 128), name="a"), te.placeholder((128, 96), name="b")
    k = te.reduce_axis((0, 128), "k")
    out = te.compute((64, 96), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k))
    return te.create_prim_func([a, b, out]).with_attr("global_symbol", "main")


def _spaces(func, space):
    mod = tvm.IRModule({"main": func})
    context = ms.TuneContext(mod, target=TARGET, space_generator=space,
                             search_strategy="evolutionary", task_name="t", num_threads=2)
    return context.space_generator.generate_design_space(mod)


def _sampled(schedule):
    insts = [i for i in schedule.trace.insts if i.kind.name == "SampleCategorical"]
    decisions = schedule.trace.decisions
    return [int(inst.attrs[0][int(decisions[inst])]) for inst in insts]


def test_the_untuned_tile_is_the_default_decision():
    spaces = _spaces(_matmul(), default_rules_space(TARGET))
    assert len(spaces) == 1
    # 96 columns: two 16-lane vectors (as untuned); 64 rows: blocks of 8 (24 accumulators max);
    # the reduction not unrolled (as untuned)
    assert _sampled(spaces[0]) == [32, 8, 1]


def test_union_adds_the_default_rules_space_to_metaschedule():
    union = _spaces(_matmul(), search_space(TARGET))
    alone = _spaces(_matmul(), ms.space_generator.PostOrderApply())
    assert len(union) == len(alone) + 1
    assert _sampled(union[0]) == [32, 8, 1]  # first: a first round measures spaces in order


def test_the_untuned_schedule_comes_before_metaschedules_spaces():
    """MetaSchedule gave BERT's attention kernel 81 design spaces; a first round of 6
    candidates measured the first 6, and the untuned schedule, last, never."""
    x = te.placeholder((12, 128), name="x")
    softmax = te.create_prim_func([x, topi.nn.softmax(x, axis=-1)]).with_attr(
        "global_symbol", "main")
    union = _spaces(softmax, search_space(TARGET))
    assert len(union) > 1 and len(union[0].trace.decisions) == 0
    assert all(len(space.trace.decisions) for space in union[1:])


def test_a_non_contraction_gets_its_untuned_schedule_as_a_space_without_decisions():
    from aotc.compiler.default_schedules import first_schedule_that_works
    from aotc.compiler.default_schedules.cpu_rules import RULES
    x = te.placeholder((12, 128), name="x")
    softmax = te.create_prim_func([x, topi.nn.softmax(x, axis=-1)]).with_attr(
        "global_symbol", "main")
    before = softmax.script()
    spaces = _spaces(softmax, default_rules_space(TARGET))
    assert len(spaces) == 1 and len(spaces[0].trace.decisions) == 0
    untuned = first_schedule_that_works(RULES, softmax, TARGET)  # what compile applies
    tvm.ir.assert_structural_equal(spaces[0].mod["main"], untuned.mod["main"])
    assert softmax.script() == before
    # its trace replays on the kernel, as the searches replay every design space
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": softmax}))
    spaces[0].trace.apply_to_schedule(sch, remove_postproc=True)
    tvm.ir.assert_structural_equal(sch.mod["main"], untuned.mod["main"])


def _with_decisions(schedule, values):
    """The schedule's trace replayed with its categorical decisions set to ``values``."""
    trace = schedule.trace
    insts = [i for i in trace.insts if i.kind.name == "SampleCategorical"]
    for inst, value in zip(insts, values):
        trace = trace.with_decision(inst, [int(c) for c in inst.attrs[0]].index(value), True)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": _matmul()}))
    trace.apply_to_schedule(sch, remove_postproc=True)
    return sch


@pytest.mark.parametrize("decisions", [None, [16, 4, 4], [48, 2, 8]])
def test_schedules_from_the_space_compute_the_matmul(decisions):
    schedule = _spaces(_matmul(), default_rules_space(TARGET))[0]
    if decisions is not None:
        schedule = _with_decisions(schedule, decisions)
        assert _sampled(schedule) == decisions
    lib = tvm.compile(schedule.mod, target=TARGET)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 128)).astype(np.float32)
    b = rng.standard_normal((128, 96)).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros((64, 96), np.float32))
    skip_unless_runs_here(TARGET)
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_winograd_transforms_get_their_default_schedule_as_a_space():
    """Not contractions, but their untuned schedule is a candidate (the tuner's "never slower
    than the default" then holds for them as for the contractions)."""
    from aotc.compiler import winograd_kernels as wk
    x = te.placeholder((1, 14, 14, 16), name="x")
    func = te.create_prim_func([x, wk.input_transform(x, 2, (1, 1, 1, 1))])
    spaces = _spaces(func.with_attr("global_symbol", "main"), default_rules_space(TARGET))
    assert len(spaces) == 1
    assert "T.parallel" in spaces[0].mod.script(), "the tiles run in parallel"


def test_a_kernel_whose_metaschedule_space_fails_keeps_the_default_rules_space():
    """MetaSchedule's rules for a sapphirerapids target fail on the one-kernel attention (a
    ScheduleError in reverse-compute-at, which ended `aotc tune` of BERT on such a host):
    the kernel gets the default rules' space alone, and a kernel whose MetaSchedule space
    builds keeps both."""
    from tvm import relax

    from aotc.compiler.default_schedules import cpu_rules  # noqa: F401 (rules registered)
    from aotc.compiler.passes.fusion import FuseAttention
    spr = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
    mod = relax.transform.FuseTIR()(relax.transform.LegalizeOps()(FuseAttention()(
        attention_module(mask=False))))
    (attention,) = [f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    attention = attention.with_attr("global_symbol", "main")
    from aotc.schedules.space import metaschedule_space_builds
    assert not metaschedule_space_builds(spr, attention)
    context = ms.TuneContext(tvm.IRModule({"main": attention}), target=spr,
                             space_generator=search_space(spr, attention),
                             search_strategy="evolutionary", task_name="t", num_threads=2)
    spaces = context.space_generator.generate_design_space(context.mod)
    assert len(spaces) == 1 and len(spaces[0].trace.decisions) == 0
    assert metaschedule_space_builds(spr, _matmul())
