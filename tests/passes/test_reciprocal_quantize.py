"""relax.quantize with a constant scale legalizes to a multiply by its reciprocal (no vector
division in every int8 kernel's epilogue); a per-channel one to a multiply by a constant vector
of reciprocals read per channel; scales that are not constants keep TVM's division. Numbers:
at most one quantization step from TVM's own lowering, and that only on a few elements that
lie within an ulp of a half-way point."""

import json

import numpy as np
import pytest
import tvm
from relax_helpers import kernel_node_types
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from aotc.compiler.default_schedules.reciprocal_quantize import LEGALIZE_MAP
from aotc.targets import resolve

TARGET = tvm.target.Target(resolve("x86").tvm_target)
RNG = np.random.default_rng(0)


def _module(scale, zero_point, dtype="uint8", shape=(1, 64, 64, 32)):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        out = bb.emit(relax.op.quantize(x, relax.const(scale), relax.const(zero_point),
                                        axis=-1, out_dtype=dtype))
        bb.emit_func_output(out)
    return bb.get()


def _divides(mod) -> bool:
    """Whether a kernel of ``mod`` divides floats (TVM's own lowering of quantize does)."""
    return "prim.Div" in kernel_node_types(mod)


def _calls(mod) -> set[str]:
    """Names of the ops ``mod``'s kernels call."""
    names = set()
    for _, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            names |= {node["data"] for node in json.loads(tvm.ir.save_json(func))["nodes"]
                      if node["type"] == "ir.Op"}
    return names


def _run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@I.ir_module
class ExpectedReciprocal:
    """quantize(x, 0.0173, 3) as a multiply by fl(1 / 0.0173) = 57.803466796875, rounded,
    offset by the zero point and clipped to uint8: no division."""

    @T.prim_func(private=True, s_tir=True)
    def quantize(x: T.Buffer((T.int64(1), T.int64(64), T.int64(64), T.int64(32)), "float32"),
                 quantized: T.Buffer((T.int64(1), T.int64(64), T.int64(64), T.int64(32)),
                                     "uint8")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1, i2, i3 in T.grid(T.int64(1), T.int64(64), T.int64(64), T.int64(32)):
            with T.sblock("quantized"):
                v0, v1, v2, v3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
                T.reads(x[v0, v1, v2, v3])
                T.writes(quantized[v0, v1, v2, v3])
                quantized[v0, v1, v2, v3] = T.Cast("uint8", T.max(T.min(
                    T.round(x[v0, v1, v2, v3] * T.float32(57.803466796875)) + T.float32(3.0),
                    T.float32(255.0)), T.float32(0.0)))

    @R.function
    def main(x: R.Tensor((1, 64, 64, 32), "float32")) -> R.Tensor((1, 64, 64, 32), "uint8"):
        cls = ExpectedReciprocal
        gv = R.call_tir(cls.quantize, (x,), out_ty=R.Tensor((1, 64, 64, 32), "uint8"))
        return gv


def test_a_constant_scale_becomes_a_reciprocal_multiply():
    before = _module(np.float32(0.0173), np.int32(3))
    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(before)
    tvm.ir.assert_structural_equal(after, ExpectedReciprocal)
    default = relax.transform.LegalizeOps()(before)
    assert _divides(default) and not _divides(after)
    x = (RNG.standard_normal((1, 64, 64, 32)) * 2).astype(np.float32)
    ours, tvms = _run(after, x).astype(np.int32), _run(default, x).astype(np.int32)
    assert np.abs(ours - tvms).max() <= 1
    assert np.mean(ours != tvms) < 1e-3, np.mean(ours != tvms)
    assert ours.min() == 0 and ours.max() == 255  # clipped to uint8 around the zero point


def test_int8_output_and_negative_zero_point():
    before = _module(np.float32(0.05), np.int8(-7), "int8")
    x = (RNG.standard_normal((1, 64, 64, 32)) * 4).astype(np.float32)
    ours = _run(relax.transform.LegalizeOps(LEGALIZE_MAP)(before), x).astype(np.int32)
    tvms = _run(relax.transform.LegalizeOps()(before), x).astype(np.int32)
    assert np.abs(ours - tvms).max() <= 1 and np.mean(ours != tvms) < 1e-3
    assert ours.min() == -128 and ours.max() == 127


@pytest.mark.parametrize("zero_points", [np.zeros(32, np.int32), np.arange(32, dtype=np.int32)])
def test_per_channel_scales_multiply_by_a_vector_of_reciprocals(zero_points):
    scales = RNG.uniform(0.01, 0.1, 32).astype(np.float32)
    before = _module(scales, zero_points)
    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(before)
    assert not _divides(after)
    # the reciprocals are a constant input of the kernel, read by channel
    kernel = [f for _, f in after.functions.items() if isinstance(f, tirx.PrimFunc)][0]
    assert len(kernel.params) == (3 if zero_points.any() else 2) + 1
    x = (RNG.standard_normal((1, 64, 64, 32)) * 2).astype(np.float32)
    ours = _run(after, x).astype(np.int32)
    tvms = _run(relax.transform.LegalizeOps()(before), x).astype(np.int32)
    assert np.abs(ours - tvms).max() <= 1
    assert np.mean(ours != tvms) < 1e-3, np.mean(ours != tvms)


def test_a_scale_computed_at_run_time_keeps_the_division():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 4), "float32"))
    with bb.function("main", [x]):
        scale = bb.emit(relax.op.max(x))
        out = bb.emit(relax.op.quantize(x, scale, relax.const(np.int32(0)), axis=-1,
                                        out_dtype="uint8"))
        bb.emit_func_output(out)
    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(bb.get())
    assert _divides(after)


@pytest.mark.parametrize("zero_point, dtype", [(np.int32(3), "uint8"), (np.int8(-7), "int8"),
                                               (np.int32(0), "uint8")])
def test_on_llvm_targets_lrint_rounds_and_converts_to_the_same_codes(zero_point, dtype):
    """Under an LLVM target the kernel clips, then rounds with llvm.lrint (one vcvtps2dq on
    x86) and adds the zero point to the integer: the same codes as round-then-clip, exactly,
    with half-way points, infinities and values far outside the codes included."""
    before = _module(np.float32(0.25), zero_point, dtype)
    with TARGET:
        on_llvm = relax.transform.LegalizeOps(LEGALIZE_MAP)(before)
    plain = relax.transform.LegalizeOps(LEGALIZE_MAP)(before)
    assert _calls(on_llvm) == {"tirx.call_llvm_pure_intrin"}  # llvm.lrint, no round
    assert _calls(plain) == {"tirx.round"}
    x = (RNG.standard_normal((1, 64, 64, 32)) * 40).astype(np.float32)
    x.reshape(-1)[:12] = [0.125, 0.375, -0.125, -0.375, 0.625, np.inf, -np.inf, 1e20, -1e20,
                          31.875, -32.125, 63.625]  # x * 4 lands on half-way points
    np.testing.assert_array_equal(_run(on_llvm, x), _run(plain, x))
