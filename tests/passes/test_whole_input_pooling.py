"""WholeInputPooling: a pool whose one window covers the input becomes a reduction (IR before
and after), other pools stay, and ONNX pools of both kinds still match onnxruntime."""

import numpy as np
import onnx
import pytest
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper
from tvm import relax
from tvm.script import relax as R

from aotc.compiler.passes import WholeInputPooling


def _pool_module(kind: str, pool_size, padding=(0, 0, 0, 0), layout="NCHW"):
    shape = (1, 8, 7, 7) if layout == "NCHW" else (1, 7, 7, 8)
    op = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(op(x, pool_size=pool_size, strides=pool_size, padding=padding,
                                  ceil_mode=True, layout=layout))
        bb.emit_func_output(y)
    return bb.get()


def test_whole_input_average_becomes_a_mean():
    @R.function
    def main(x: R.Tensor((1, 8, 7, 7), "float32")):
        with R.dataflow():
            y = R.mean(x, axis=[2, 3], keepdims=True)
            R.output(y)
        return y
    after = WholeInputPooling()(_pool_module("avg", (1280, 1280)))
    tvm.ir.assert_structural_equal(after, tvm.IRModule({"main": main.with_attr(
        "global_symbol", "main")}))


def test_whole_input_max_in_nhwc_becomes_a_max():
    @R.function
    def main(x: R.Tensor((1, 7, 7, 8), "float32")):
        with R.dataflow():
            y = R.max(x, axis=[1, 2], keepdims=True)
            R.output(y)
        return y
    after = WholeInputPooling()(_pool_module("max", (7, 9), layout="NHWC"))
    tvm.ir.assert_structural_equal(after, tvm.IRModule({"main": main.with_attr(
        "global_symbol", "main")}))


@pytest.mark.parametrize("pool_size,padding", [((3, 3), (0, 0, 0, 0)),   # several windows
                                               ((8, 8), (1, 1, 1, 1))])  # padded
def test_other_pools_stay(pool_size, padding):
    before = _pool_module("avg", pool_size, padding)
    tvm.ir.assert_structural_equal(WholeInputPooling()(before), before)


@pytest.mark.parametrize("op,attrs", [
    ("AveragePool", {"kernel_shape": [1280, 1280], "strides": [1280, 1280], "ceil_mode": 1,
                     "count_include_pad": 1}),  # transformers' EfficientNet head
    ("AveragePool", {"kernel_shape": [7, 7]}),
    ("MaxPool", {"kernel_shape": [9, 9], "ceil_mode": 1, "strides": [9, 9]}),
    ("AveragePool", {"kernel_shape": [9, 9], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
])
def test_onnx_pools_match_onnxruntime(tmp_path, op, attrs):
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **attrs)], "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.random.default_rng(0).standard_normal((1, 16, 7, 7)).astype(np.float32)
    check_against_onnxruntime(path, tmp_path, feed={"x": x}, rtol=1e-5, atol=1e-6)
