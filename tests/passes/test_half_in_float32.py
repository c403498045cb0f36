"""HalfInFloat32: float16/bfloat16 matmuls, softmax and friends compute in float32 and round
once; elementwise ops and float32 ops are left alone; a compiled float16 model's long dot
products stay within one float16 ulp of the exact answer (a float16 accumulator is not)."""

import numpy as np
import onnx
import tvm
from helpers import compile_and_load
from onnx import TensorProto, helper
from tvm import relax
from tvm.script import relax as R

from aotc.compiler.passes import HalfInFloat32


def _calls(func) -> list[relax.Call]:
    return [b.value for b in func.body.blocks[0].bindings if isinstance(b.value, relax.Call)]


def test_half_matmul_and_softmax_run_in_float32():
    @R.function
    def main(x: R.Tensor((2, 8), "float16"), w: R.Tensor((8, 4), "float16")):
        with R.dataflow():
            y = R.matmul(x, w, out_dtype="float16")
            s = R.nn.softmax(y)
            z = R.add(s, s)
            R.output(z)
        return z

    after = HalfInFloat32()(tvm.IRModule({"main": main}))["main"]
    ops = [(c.op.name, c.ty.dtype) for c in _calls(after)]
    assert ops == [("relax.astype", "float32"), ("relax.astype", "float32"),
                   ("relax.matmul", "float32"), ("relax.astype", "float16"),
                   ("relax.astype", "float32"), ("relax.nn.softmax", "float32"),
                   ("relax.astype", "float16"), ("relax.add", "float16")]
    assert after.body.ty.dtype == "float16"


def test_float32_and_integer_ops_are_untouched():
    @R.function
    def main(x: R.Tensor((2, 8), "float32"), i: R.Tensor((2, 8), "int32")):
        with R.dataflow():
            y = R.nn.softmax(x)
            j = R.sum(i, axis=[1])
            R.output(y, j)
        return (y, j)

    before = tvm.IRModule({"main": main})
    tvm.ir.assert_structural_equal(HalfInFloat32()(before), before)


def _half_matmul_model(k: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "half_matmul",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT16, [4, k]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT16, [k, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_long_float16_dot_products_round_once(tmp_path):
    k = 4096
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 1, (4, k)).astype(np.float16)
    b = rng.uniform(0, 1, (k, 8)).astype(np.float16)
    model = compile_and_load(_half_matmul_model(k), tmp_path)
    got = model.run({"a": a, "b": b})["y"].astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    ulp = np.spacing(exact.astype(np.float16)).astype(np.float64)
    # A float16 accumulator stops growing near 2048 (ulp 2): ~1024 would come out here.
    assert np.max(np.abs(got - exact) / ulp) <= 1.0
