"""Models quantized by onnxruntime compile and match onnxruntime's own int8 results: static
quantization in QDQ and QOperator formats (QLinearConv, QLinearMatMul and the com.microsoft
QGemm, QLinearAdd, QLinearMul, QLinearConcat, QLinearSigmoid, QLinearGlobalAveragePool,
QLinearAveragePool), and dynamic quantization (DynamicQuantizeLinear, MatMulInteger).

QOperator models match onnxruntime exactly or nearly. In QDQ models onnxruntime fuses the
pattern into integer kernels and aotc computes the graph's float ops: where a value lands near
a rounding boundary of a QuantizeLinear, one quantization step flips and later layers carry
it, up to a few steps of the output. So each test checks that aotc is as accurate as
onnxruntime's int8 against the float model (its error at most onnxruntime's plus 2% of the
output's range), and that the outputs agree with onnxruntime's within 2% of that range (5%
for QDQ). Every test draws its data from its own
seed: module-wide random state made the data depend on which tests a worker ran before."""

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
from aotc.targets.x86 import cpu_flags


def _w(rng, name, *shape):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)


def branchy_cnn(rng=None) -> onnx.ModelProto:
    """conv -> (sigmoid * conv) + conv, concat, average pool, matmul: the ops whose QOperator
    forms are com.microsoft contrib ops."""
    rng = rng or np.random.default_rng(0)
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
        [_w(rng, "w1", 16, 8, 3, 3), _w(rng, "b1", 16), _w(rng, "w2", 16, 16, 3, 3),
         _w(rng, "b2", 16), _w(rng, "fc", 32 * 36, 10),
         numpy_helper.from_array(np.array([1, -1], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Reader(CalibrationDataReader):
    def __init__(self, rng):
        self.samples = iter([{"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32)}
                             for _ in range(8)])

    def get_next(self):
        return next(self.samples, None)


# Without VNNI, onnxruntime's u8 x s8 kernels add pairs of products in 16 bits (vpmaddubsw),
# which saturate: on an AVX2-only host its int8 outputs were up to 9.4% of their range from the
# float model's (aotc's: up to 3.3%). Its results are the reference only where it has VNNI.
ORT_INT8_EXACT = bool({"avx512_vnni", "avx_vnni"} & cpu_flags())


def _check(path, float_path, tmp_path, feed, agree=0.02):
    aotc.compile(path, "x86", tmp_path / "q.so")
    want = ort.InferenceSession(str(path)).run(None, feed)[0]
    exact = ort.InferenceSession(str(float_path)).run(None, feed)[0]
    got = list(aotc.load(tmp_path / "q.so").run(feed).values())[0]
    span = want.max() - want.min()
    if ORT_INT8_EXACT:
        np.testing.assert_allclose(got, want, atol=agree * span)
    assert np.abs(got - exact).max() <= np.abs(want - exact).max() + 0.02 * span


@pytest.mark.parametrize("builder", [tiny_cnn, branchy_cnn])
@pytest.mark.parametrize("fmt", [QuantFormat.QOperator, QuantFormat.QDQ])
def test_static_quantized(builder, fmt, tmp_path):
    float_path, path = tmp_path / "f.onnx", tmp_path / "q.onnx"
    rng = np.random.default_rng([fmt.value, builder is branchy_cnn])
    onnx.save(branchy_cnn(rng) if builder is branchy_cnn else builder(), float_path)
    quantize_static(str(float_path), str(path), _Reader(rng), quant_format=fmt, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(path).graph.node}
    if fmt == QuantFormat.QOperator:
        assert "QLinearConv" in ops
        if builder is branchy_cnn:
            assert {"QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearSigmoid",
                    "QLinearAveragePool", "QLinearMatMul"} <= ops, ops
    _check(path, float_path, tmp_path,
           {"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32)},
           agree=0.05 if fmt == QuantFormat.QDQ else 0.02)


def test_dynamic_quantized(tmp_path):
    float_path, path = tmp_path / "f.onnx", tmp_path / "q.onnx"
    rng = np.random.default_rng(2)
    onnx.save(branchy_cnn(rng), float_path)
    quantize_dynamic(str(float_path), str(path), weight_type=QuantType.QInt8)
    assert "MatMulInteger" in {n.op_type for n in onnx.load(path).graph.node}
    _check(path, float_path, tmp_path,
           {"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32)})
