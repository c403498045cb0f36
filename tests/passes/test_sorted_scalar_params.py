"""SortScalarParams: a kernel's scalar parameters sorted by name and its calls' arguments
permuted with them, IR before and after; kernels it cannot rewrite safely are left alone. A
model whose kernel takes ``past_len`` and ``seq`` as scalars, compiled twice to the same bytes
and checked against onnxruntime, is in tests/test_reproducible_build.py."""

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from aotc.compiler.passes.lowering import SortScalarParams
from aotc.compiler.passes.lowering.sorted_scalar_params import permutation


@I.ir_module
class Before:
    @T.prim_func(private=True)
    def fill(x: T.Buffer((T.int64(2),), "float32"), seq: T.int64, past: T.int64,
             out: T.Buffer((T.int64(3),), "float32")):
        out[0] = x[0] * T.Cast("float32", seq)
        out[1] = x[1] - T.Cast("float32", past)
        out[2] = T.float32(0)

    @R.function
    def main(x: R.Tensor((2,), "float32"), y: R.Tensor(("past", "seq"), "float32")):
        past, seq = T.int64(), T.int64()
        cls = Before
        with R.dataflow():
            z = R.call_tir(cls.fill, (x, R.prim_value(seq), R.prim_value(past)),
                           out_ty=R.Tensor((3,), "float32"))
            R.output(z)
        return z


@I.ir_module
class Expected:
    @T.prim_func(private=True)
    def fill(x: T.Buffer((T.int64(2),), "float32"), past: T.int64, seq: T.int64,
             out: T.Buffer((T.int64(3),), "float32")):
        out[0] = x[0] * T.Cast("float32", seq)
        out[1] = x[1] - T.Cast("float32", past)
        out[2] = T.float32(0)

    @R.function
    def main(x: R.Tensor((2,), "float32"), y: R.Tensor(("past", "seq"), "float32")):
        past, seq = T.int64(), T.int64()
        cls = Expected
        with R.dataflow():
            z = R.call_tir(cls.fill, (x, R.prim_value(past), R.prim_value(seq)),
                           out_ty=R.Tensor((3,), "float32"))
            R.output(z)
        return z


def _run(mod: tvm.IRModule) -> np.ndarray:
    executable = relax.build(mod, tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    x = tvm.runtime.tensor(np.array([2.0, 10.0], "float32"))
    y = tvm.runtime.tensor(np.zeros((3, 5), "float32"))  # past = 3, seq = 5
    return vm["main"](x, y).numpy()


def test_scalars_are_sorted_and_calls_follow():
    after = SortScalarParams()(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    np.testing.assert_array_equal(_run(after), [10.0, 7.0, 0.0])
    np.testing.assert_array_equal(_run(Before), _run(after))


def test_sorted_kernels_leave_the_module():
    assert SortScalarParams()(Expected).same_as(Expected)


def test_a_kernel_referenced_outside_call_tir_is_left_alone():
    @I.ir_module
    class Passed:
        @T.prim_func(private=True)
        def fill(seq: T.int64, past: T.int64, out: T.Buffer((T.int64(2),), "int64")):
            out[0] = seq
            out[1] = past

        @R.function
        def main(y: R.Tensor(("past", "seq"), "float32")):
            past, seq = T.int64(), T.int64()
            cls = Passed
            with R.dataflow():
                z = R.call_tir(cls.fill, (R.prim_value(seq), R.prim_value(past)),
                               out_ty=R.Tensor((2,), "int64"))
                R.output(z)
            return (z, cls.fill)  # the kernel as a value: its signature must not change

    assert SortScalarParams()(Passed).same_as(Passed)


def test_an_exported_kernel_keeps_its_signature():
    exported = Before.with_attr("unused", 0)  # a copy of the module
    exported["fill"] = Before["fill"].with_attr("global_symbol", "fill")
    assert SortScalarParams()(exported).same_as(exported)


def test_scalars_sharing_a_name_are_left_alone():
    """No order by name exists for them (TVMScript cannot spell such a kernel: built here)."""
    first, second = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("n", "int64")
    twins = tvm.tirx.PrimFunc([first, second], tvm.tirx.Evaluate(first + second))
    assert permutation(twins, 2) is None
    assert permutation(Before["fill"], 3) == [0, 2, 1]
    assert permutation(Expected["fill"], 3) is None
