"""Models quantized by onnxruntime compile and match onnxruntime's own int8 results: static
quantization in QDQ and QOperator formats (QLinearConv, QLinearMatMul and the com.microsoft
QGemm, QLinearAdd, QLinearMul, QLinearConcat, QLinearSigmoid, QLinearGlobalAveragePool,
QLinearAveragePool), and dynamic quantization (DynamicQuantizeLinear, MatMulInteger).
onnxruntime requantizes exact int32 sums, aotc the float op's result: outputs agree to about
one quantization step of the output (atol: 2% of the output's range)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import tiny_cnn
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

import aotc

RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.2, name)


def branchy_cnn() -> onnx.ModelProto:
    """conv -> (sigmoid * conv) + conv, concat, average pool, matmul: the ops whose QOperator
    forms are com.microsoft contrib ops."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s"]),
        helper.make_node("Conv", ["c1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["s", "c2"], ["m"]),
        helper.make_node("Add", ["m", "c1"], ["a"]),
        helper.make_node("Concat", ["a", "c2"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "branchy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [_w("w1", 16, 8, 3, 3), _w("b1", 16), _w("w2", 16, 16, 3, 3), _w("b2", 16),
         _w("fc", 32 * 36, 10), numpy_helper.from_array(np.array([1, -1], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Reader(CalibrationDataReader):
    def __init__(self):
        self.samples = iter([{"x": RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)}
                             for _ in range(8)])

    def get_next(self):
        return next(self.samples, None)


def _check(path, tmp_path, feed):
    aotc.compile(path, "x86", tmp_path / "q.so")
    want = ort.InferenceSession(str(path)).run(None, feed)[0]
    got = list(aotc.load(tmp_path / "q.so").run(feed).values())[0]
    np.testing.assert_allclose(got, want, atol=0.02 * (want.max() - want.min()))


@pytest.mark.parametrize("builder", [tiny_cnn, branchy_cnn])
@pytest.mark.parametrize("fmt", [QuantFormat.QOperator, QuantFormat.QDQ])
def test_static_quantized(builder, fmt, tmp_path):
    float_path, path = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(builder(), float_path)
    quantize_static(str(float_path), str(path), _Reader(), quant_format=fmt, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(path).graph.node}
    if fmt == QuantFormat.QOperator:
        assert "QLinearConv" in ops
        if builder is branchy_cnn:
            assert {"QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearSigmoid",
                    "QLinearAveragePool", "QLinearMatMul"} <= ops, ops
    _check(path, tmp_path, {"x": RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)})


def test_dynamic_quantized(tmp_path):
    float_path, path = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(branchy_cnn(), float_path)
    quantize_dynamic(str(float_path), str(path), weight_type=QuantType.QInt8)
    assert "MatMulInteger" in {n.op_type for n in onnx.load(path).graph.node}
    _check(path, tmp_path, {"x": RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)})
