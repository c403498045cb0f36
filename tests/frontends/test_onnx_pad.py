"""ONNX Pad with constant, non-negative pads on a float tensor becomes Relax's nn.pad
(onnx_pad.py), which FoldPadIntoConv folds into the convolution after it: an EfficientNet-style
asymmetric pad before a stride-2 depthwise convolution leaves no pad kernel. Every other Pad
(negative pads, other modes, integer data, run-time pads) still matches onnxruntime."""

import numpy as np
import onnx
import pytest
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax import op as R

from aotc.compiler.frontends.onnx_pad import convert_pad


def _x(shape=(1, 8, 9, 9), dtype="float32"):
    return relax.Var("x", relax.TensorType(shape, dtype))


def test_constant_pads_become_the_relax_op():
    x = _x()
    pads = relax.const(np.array([0, 1, 0, 2], np.int64))    # H, W: before 0, after 1 and 2
    axes = relax.const(np.array([2, -1], np.int64))
    got = convert_pad(None, [x, pads, relax.const(np.float32(0.5)), axes], {}, 18, None)
    tvm.ir.assert_structural_equal(got, R.nn.pad(x, [0, 0, 0, 0, 0, 0, 1, 2], "constant", 0.5))
    # opset 2: pads and value are attributes
    got = convert_pad(None, [x], {"pads": [0, 0, 1, 1, 0, 0, 2, 2]}, 2, None)
    tvm.ir.assert_structural_equal(got, R.nn.pad(x, [0, 0, 0, 0, 1, 2, 1, 2], "constant", 0.0))


@pytest.mark.parametrize("inputs, attrs, dtype", [
    ([np.array([0, 0, -1, 0, 0, 0, 1, 0])], {}, "float32"),            # a crop
    ([np.array([0, 0, 1, 1, 0, 0, 1, 1])], {"mode": b"edge"}, "float32"),
    ([np.array([0, 0, 1, 1, 0, 0, 1, 1])], {}, "int64"),
])
def test_other_pads_are_left_to_the_other_converters(inputs, attrs, dtype):
    x = _x(dtype=dtype)
    constants = [relax.const(v) for v in inputs]
    assert convert_pad(relax.BlockBuilder(), [x, *constants], attrs, 18, None) is None


def _pad_then_depthwise(path, pads, opset=18):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
             helper.make_node("Conv", ["p", "w"], ["y"], group=8, strides=[2, 2],
                              kernel_shape=[3, 3])]
    graph = helper.make_graph(
        nodes, "pad_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          [1, 8, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
         numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def test_an_asymmetric_pad_folds_into_the_strided_depthwise_conv(tmp_path):
    path = _pad_then_depthwise(tmp_path / "same.onnx", [0, 0, 0, 0, 0, 0, 1, 1])
    model, _ = check_against_onnxruntime(path, tmp_path, rtol=1e-5, atol=1e-5)
    names = [k["name"] for k in model.metadata["kernels"]]
    assert not [n for n in names if "pad" in n], names   # (transposes: the NCHW input/output)


@pytest.mark.parametrize("pads, mode, elem", [
    ([0, 0, 2, 1, 0, 0, 0, 3], "constant", TensorProto.FLOAT),
    ([0, 0, -1, 2, 0, 0, 1, -2], "constant", TensorProto.FLOAT),   # crops and pads
    ([0, 0, 1, 2, 0, 0, 2, 1], "reflect", TensorProto.FLOAT),
    ([0, 0, 1, 2, 0, 0, 2, 1], "constant", TensorProto.INT32),
])
def test_every_pad_matches_onnxruntime(tmp_path, pads, mode, elem):
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads", "value"], ["y"], mode=mode)], "pad",
        [helper.make_tensor_value_info("x", elem, [2, 3, 5, 6])],
        [helper.make_tensor_value_info("y", elem, None)],
        [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
         numpy_helper.from_array(np.array(3, helper.tensor_dtype_to_np_dtype(elem)), "value")])
    path = tmp_path / "pad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    check_against_onnxruntime(path, tmp_path)
