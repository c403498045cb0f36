"""onnx_rewrites.conv_auto_pad: Conv's auto_pad becomes explicit pads (the node before and
after), and such convs still match onnxruntime (odd sizes, strides, dilation, both SAME
modes, VALID)."""

import numpy as np
import onnx
import pytest
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper, numpy_helper

from aotc.compiler.frontends.onnx_graph import GraphInfo, node_attrs
from aotc.compiler.frontends.onnx_rewrites import conv_auto_pad


def _model(auto_pad: str, size: int, kernel: int, stride: int, dilation: int = 1):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((6, 4, kernel, kernel)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=auto_pad, strides=[stride] * 2,
                          dilations=[dilation] * 2)], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("auto_pad,size,kernel,stride,pads", [
    ("SAME_UPPER", 7, 3, 2, [1, 1, 1, 1]),   # out 4: total 2
    ("SAME_UPPER", 8, 3, 2, [0, 0, 1, 1]),   # out 4: total 1, the odd pixel at the end
    ("SAME_LOWER", 8, 3, 2, [1, 1, 0, 0]),   # ... at the start
    ("VALID", 9, 5, 1, [0, 0, 0, 0]),
])
def test_auto_pad_becomes_pads(auto_pad, size, kernel, stride, pads):
    model = _model(auto_pad, size, kernel, stride)
    [node] = conv_auto_pad(model.graph.node[0], GraphInfo(model, 17))
    attrs = node_attrs(node)
    assert "auto_pad" not in attrs and attrs["pads"] == pads
    assert attrs["strides"] == [stride, stride] and list(node.input) == ["x", "w"]


def test_notset_is_left_alone():
    model = _model("NOTSET", 8, 3, 1)
    assert conv_auto_pad(model.graph.node[0], GraphInfo(model, 17)) is None


@pytest.mark.parametrize("auto_pad,size,kernel,stride,dilation", [
    ("SAME_UPPER", 8, 3, 2, 1), ("SAME_LOWER", 9, 4, 2, 1), ("SAME_UPPER", 11, 5, 3, 1),
    ("VALID", 9, 5, 2, 1)])
def test_matches_onnxruntime(tmp_path, auto_pad, size, kernel, stride, dilation):
    path = tmp_path / "conv.onnx"
    onnx.save(_model(auto_pad, size, kernel, stride, dilation), path)
    x = np.random.default_rng(1).standard_normal((1, 4, size, size)).astype(np.float32)
    check_against_onnxruntime(path, tmp_path, feed={"x": x}, rtol=1e-4, atol=1e-5)
