"""Re-timing schedules side by side (schedules/retime.py): a trace as the tuner measured it
replays into the same kernel, and every schedule is timed once in every round."""

import numpy as np
import tvm
import tvm_ffi
from tvm import te
from tvm.s_tir import meta_schedule as ms

from aotc.schedules.measure import kernel_outputs, same_values, task_module
from aotc.schedules.retime import replay, retime
from aotc.schedules.space import default_rules_space
from aotc.targets import resolve

# tuned and timed here: the host's own target
TARGET = tvm.target.Target(resolve("x86").tvm_target)


def _matmul():
    a, b = te.placeholder((64, 128), name="a"), te.placeholder((128, 96), name="b")
    k = te.reduce_axis((0, 128), "k")
    return te.create_prim_func([a, b, te.compute(
        (64, 96), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k))])


def _default_rules_schedule(func):
    """The default rules' schedule of ``func`` (its design space as it is)."""
    ctx = ms.TuneContext(task_module(func), target=TARGET,
                         space_generator=default_rules_space(TARGET))
    return ctx.generate_design_space()[0]


def default_rules_point(func):
    """The trace of the default rules' schedule of ``func``."""
    return _default_rules_schedule(func).trace


def _default_rules_trace(func):
    return default_rules_point(func).as_json()


def test_a_measured_trace_replays_into_the_kernel_it_scheduled():
    matmul = _matmul()
    trace = _default_rules_trace(matmul)
    scheduled = replay(matmul, trace)
    tvm.ir.assert_structural_equal(scheduled, _default_rules_schedule(matmul).mod["main"])
    assert not tvm_ffi.structural_equal(scheduled, matmul)
    assert same_values(kernel_outputs(scheduled, TARGET), kernel_outputs(matmul, TARGET))
    # the kernel replayed on is left as it was (TVM edited it in place once), so it replays again
    tvm.ir.assert_structural_equal(matmul, _matmul())
    tvm.ir.assert_structural_equal(replay(matmul, trace), scheduled)


def test_every_schedule_is_timed_in_every_round():
    matmul = _matmul()
    times = retime({"naive": matmul, "default": replay(matmul, _default_rules_trace(matmul))},
                   TARGET, rounds=3)
    assert sorted(times) == ["default", "naive"]
    for timing in times.values():
        assert len(timing["rounds"]) == 3 and all(t > 0 for t in timing["rounds"])
        assert timing["median"] == float(np.median(timing["rounds"]))
