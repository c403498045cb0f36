"""The tuner sees the int8 kernels compile makes (same calibration, same workload keys), and
PackedDot is one of its spaces: its tile becomes two sampled decisions whose defaults give the
untuned schedule exactly."""

import numpy as np
import pytest
import tvm
from tvm import s_tir

import aotc
from aotc.api import tuning_tasks
from aotc.compiler.default_schedules.cpu_dot import PackedDot
from aotc.targets import int8_dot

TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})


def test_tasks_include_int8_kernels_and_default_is_a_point(tiny_onnx):
    calib = np.random.default_rng(0).standard_normal((4, 1, 8, 12, 12)).astype(np.float32)
    tasks, _target, _default = tuning_tasks(tiny_onnx, "x86",
                                            quantize=aotc.QuantizeOptions(list(calib)))
    int8 = [t for t in tasks if "int8" in t.name]
    assert len(int8) == 2, [t.name for t in tasks]  # the conv and the classifier
    for task in int8:
        traced = s_tir.Schedule(task.func)
        assert PackedDot().schedule(traced, TARGET, tunable=True) is not None
        assert len(traced.trace.decisions) == 2
        untuned = PackedDot().apply(task.func, TARGET, False)
        tvm.ir.assert_structural_equal(traced.mod, untuned.mod)


def test_int8_kernels_are_searched_in_the_default_rules_spaces_only(tiny_onnx):
    """MetaSchedule's own design spaces give int8 kernels that do not build (LLVM verification
    errors on every candidate of an int8 conv of MobileNetV2), so the int8 kernels' space is
    the default rules' (one space per parallel-tile order); a float32 kernel keeps both."""
    from tvm.s_tir import meta_schedule as ms

    from aotc.compiler.default_schedules.cpu_dot import packed_format
    from aotc.schedules.measure import task_module
    from aotc.schedules.space import search_space
    calib = np.random.default_rng(0).standard_normal((4, 1, 8, 12, 12)).astype(np.float32)
    tasks, target, _default = tuning_tasks(tiny_onnx, "x86",
                                           quantize=aotc.QuantizeOptions(list(calib)))

    def spaces(func, space):
        mod = task_module(func)
        context = ms.TuneContext(mod, target=target, space_generator=space,
                                 search_strategy="evolutionary", task_name="t", num_threads=2)
        return context.space_generator.generate_design_space(mod)

    int8 = [t for t in tasks if "int8" in t.name]
    assert [packed_format(t.func) for t in int8] == ["int8", "int8"]
    if int8_dot(target) is None:  # the calibration runs on the host, so the target is its own
        pytest.skip("without VNNI the int8 kernels are Contraction's, not PackedDot's")
    for task in int8:
        assert len(spaces(task.func, search_space(target, task.func))) == 2
        assert len(spaces(task.func, search_space(target))) > 2  # MetaSchedule's too
    fp32_tasks, fp32_target, _ = tuning_tasks(tiny_onnx, "x86")
    conv = next(t for t in fp32_tasks if packed_format(t.func) == "fp32")
    assert len(spaces(conv.func, search_space(fp32_target, conv.func))) > 2
