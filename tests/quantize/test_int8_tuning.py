"""The tuner sees the int8 kernels compile makes (same calibration, same workload keys), and
PackedDot is one of its spaces: its tile becomes two sampled decisions whose defaults give the
untuned schedule exactly."""

import numpy as np
import tvm
from tvm import s_tir

import aotc
from aotc.api import tuning_tasks
from aotc.compiler.lower.cpu_dot import PackedDot

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
