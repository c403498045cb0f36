"""Conv1dAsConv2d: a conv1d becomes a conv2d over a unit height (IR before and after), and
ONNX 1-D convolutions (stride, padding, dilation, groups) still match onnxruntime."""

import numpy as np
import onnx
import pytest
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import relax as R

from aotc.compiler.passes import Conv1dAsConv2d


def test_conv1d_becomes_conv2d_over_a_unit_height():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 10), "float32"))
    w = relax.Var("w", relax.TensorType((6, 4, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv1d(x, w, strides=2, padding=[1, 2], dilation=1))
        bb.emit_func_output(y)

    @R.function
    def main(x: R.Tensor((1, 4, 10), "float32"), w: R.Tensor((6, 4, 3), "float32")):
        with R.dataflow():
            y = R.squeeze(R.nn.conv2d(R.expand_dims(x, [2]), R.expand_dims(w, [2]),
                                      strides=[1, 2], padding=[0, 1, 0, 2], dilation=[1, 1]),
                          [2])
            R.output(y)
        return y
    expected = relax.transform.Normalize()(tvm.IRModule({"main": main.with_attr(
        "global_symbol", "main")}))
    tvm.ir.assert_structural_equal(Conv1dAsConv2d()(bb.get()), expected)


@pytest.mark.parametrize("attrs,channels,groups", [
    ({"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, 8, 1),  # Whisper's second conv
    ({"kernel_shape": [5], "pads": [2, 1], "dilations": [2]}, 8, 1),
    ({"kernel_shape": [3], "pads": [1, 1], "group": 8}, 8, 8),      # depthwise
])
def test_onnx_conv1d_matches_onnxruntime(tmp_path, attrs, channels, groups):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16 if groups == 1 else channels, channels // groups,
                                  attrs["kernel_shape"][0])).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], **attrs)], "conv1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 37])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")])
    path = tmp_path / "conv1d.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = rng.standard_normal((1, channels, 37)).astype(np.float32)
    check_against_onnxruntime(path, tmp_path, feed={"x": x}, rtol=1e-4, atol=1e-5)
