"""relax.quantize with a constant scale legalizes to a multiply by its reciprocal (no vector
division in every int8 kernel's epilogue); a per-channel one to a multiply by a constant vector
of reciprocals read per channel; scales that are not constants keep TVM's division. Numbers:
at most one quantization step from TVM's own lowering, and that only on a few elements that
lie within an ulp of a half-way point."""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from aotc.compiler.lower.reciprocal_quantize import LEGALIZE_MAP
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


def _kernel_script(mod) -> str:
    return [f for _, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)][0].script()


def _run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_a_constant_scale_becomes_a_reciprocal_multiply():
    before = _module(np.float32(0.0173), np.int32(3))
    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(before)
    default = relax.transform.LegalizeOps()(before)
    assert " / T.float32(" in _kernel_script(default)
    script = _kernel_script(after)
    assert " / " not in script and "T.round(x[" in script and " * T.float32(57.80" in script
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
    script = _kernel_script(after)
    assert " / " not in script and "T.round(x[" in script
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
    assert any(" / " in f.script() for _, f in after.functions.items()
               if isinstance(f, tirx.PrimFunc) and "quantize" in f.script())


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
    assert "llvm.lrint" in _kernel_script(on_llvm) and "T.round" not in _kernel_script(on_llvm)
    assert "T.round" in _kernel_script(plain)
    x = (RNG.standard_normal((1, 64, 64, 32)) * 40).astype(np.float32)
    x.reshape(-1)[:12] = [0.125, 0.375, -0.125, -0.375, 0.625, np.inf, -np.inf, 1e20, -1e20,
                          31.875, -32.125, 63.625]  # x * 4 lands on half-way points
    np.testing.assert_array_equal(_run(on_llvm, x), _run(plain, x))
