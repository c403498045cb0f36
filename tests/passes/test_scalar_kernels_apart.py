"""ScalarKernelsApart: a kernel called with scalars only (shape_to_tensor of a symbolic dim)
is marked opaque, IR before and after; kernels that read tensors keep their pattern. The
graph FuseTIR failed on without it (a GPT-2 exported with past values) is compiled and
checked against onnxruntime in tests/test_kv_cache.py."""

import tvm
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from aotc.compiler.passes.lowering import ScalarKernelsApart


def _module(op_pattern: int):
    @I.ir_module
    class Module:
        @T.prim_func(private=True)
        def shape_to_tensor(n: T.int64, out: T.Buffer((T.int64(1),), "int64")):
            T.func_attr({"op_pattern": op_pattern, "tirx.noalias": True})
            out[0] = n

        @T.prim_func(private=True)
        def add(a: T.Buffer((T.int64(1),), "int64"), b: T.Buffer((T.int64(1),), "int64"),
                out: T.Buffer((T.int64(1),), "int64")):
            T.func_attr({"op_pattern": 0, "tirx.noalias": True})
            out[0] = a[0] + b[0]

        @R.function
        def main(x: R.Tensor(("n",), "float32"), y: R.Tensor((1,), "int64")):
            n = T.int64()
            cls = Module
            with R.dataflow():
                size = R.call_tir(cls.shape_to_tensor, (R.prim_value(n),),
                                  out_ty=R.Tensor((1,), "int64"))
                total = R.call_tir(cls.add, (size, y), out_ty=R.Tensor((1,), "int64"))
                R.output(total)
            return total
    return Module


def test_scalar_only_kernels_become_opaque():
    after = ScalarKernelsApart()(_module(0))
    tvm.ir.assert_structural_equal(after, _module(8))
    assert int(after["add"].attrs["op_pattern"]) == 0


def test_nothing_to_do_leaves_the_module():
    mod = _module(8)
    mod = tvm.IRModule({gv: f for gv, f in mod.functions_items()
                        if gv.name_hint != "main"})
    assert ScalarKernelsApart()(mod).same_as(mod)
