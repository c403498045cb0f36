"""float32 x / c with c a constant legalizes to x * (1 / c): no vector division in the
epilogues of whole layers (GELU's / sqrt(2), hard-swish's / 6). Before and after: TVM's
lowering divides, ours multiplies by the constant reciprocal. Numbers: bit for bit where c is a
power of two, within one ulp otherwise; divisors that are not constants, zeros, and small
tensors keep the division."""

import numpy as np
import pytest
import tvm
from relax_helpers import kernel_node_types, run_main
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from aotc.compiler.default_schedules.reciprocal_divide import LEGALIZE_MAP, MIN_ELEMENTS


def _module(divisor, shape=(64, 96)):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    params = [x]
    if divisor is None:  # a divisor the model computes: an input
        divisor = relax.Var("d", relax.TensorType((), "float32"))
        params.append(divisor)
    with bb.function("main", params):
        out = bb.emit(relax.op.divide(x, divisor))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("divisor", [6.0, 2 ** 0.5, 8.0])
def test_constant_divisor_becomes_a_multiply_by_its_reciprocal(divisor):
    mod = _module(relax.const(divisor, "float32"))
    before = relax.transform.LegalizeOps()(mod)
    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(mod)
    assert "prim.Div" in kernel_node_types(before) and "prim.Mul" not in kernel_node_types(before)
    assert "prim.Div" not in kernel_node_types(after) and "prim.Mul" in kernel_node_types(after)
    x = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32) * 100
    want, got = run_main(before, x), run_main(after, x)
    if divisor == 8.0:
        assert np.array_equal(got, want)  # an exact reciprocal: the same numbers
    else:
        ulps = np.abs(got - want) / np.spacing(np.abs(want))
        assert ulps.max() <= 1.0


def test_per_channel_constant_divisor():
    divisors = np.linspace(0.5, 7.0, 96).astype(np.float32)
    mod = _module(relax.const(divisors))
    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(mod)
    assert "prim.Div" not in kernel_node_types(after)
    x = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32)
    np.testing.assert_allclose(run_main(after, x), x / divisors, rtol=2.5e-7, atol=0)


@pytest.mark.parametrize("case", ["input divisor", "zero", "small tensor"])
def test_other_divisions_keep_tvms_lowering(case):
    if case == "input divisor":
        mod = _module(None)
    elif case == "zero":
        mod = _module(relax.const(np.array([0.0] + [2.0] * 95, np.float32)))
    else:
        mod = _module(relax.const(255.0, "float32"), shape=(MIN_ELEMENTS - 1,))
    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(mod)
    assert "prim.Div" in kernel_node_types(after)


@I.ir_module
class _Expected:
    @T.prim_func(private=True, s_tir=True)
    def divide(x: T.Buffer((T.int64(16), T.int64(32)), "float32"),
               T_multiply: T.Buffer((T.int64(16), T.int64(32)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for ax0, ax1 in T.grid(T.int64(16), T.int64(32)):
            with T.sblock("T_multiply"):
                v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
                T.reads(x[v_ax0, v_ax1])
                T.writes(T_multiply[v_ax0, v_ax1])
                T_multiply[v_ax0, v_ax1] = x[v_ax0, v_ax1] * T.float32(0.1666666716337204)

    @R.function
    def main(x: R.Tensor((16, 32), dtype="float32")) -> R.Tensor((16, 32), dtype="float32"):
        cls = _Expected
        gv = R.call_tir(cls.divide, (x,), out_ty=R.Tensor((16, 32), dtype="float32"))
        return gv


def test_scalar_divisor_is_a_number_of_the_kernel():
    """x / 6 after: a multiply by fl(1/6), a constant of the kernel's code."""
    after = relax.transform.LegalizeOps(LEGALIZE_MAP)(_module(relax.const(6.0, "float32"),
                                                              shape=(16, 32)))
    tvm.ir.assert_structural_equal(after, _Expected)
