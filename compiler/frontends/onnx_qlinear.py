"""Quantized operators (QOperator format) as dequantize -> float op -> quantize; ConvInteger
(dynamic quantization's convolution) as a float convolution of the zero-point-centred values.

Why: TVM 0.27 has no converter for QLinearConv, and onnxruntime's ``quantize_static`` in its
QOperator format also writes com.microsoft ops (QGemm, QLinearAdd, QLinearMul,
QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QLinearSigmoid,
QLinearLeakyRelu). Each is defined as its float op on dequantized inputs, requantized: that
is what this rewrite writes, in standard ONNX, before the op check and TVM's importer (which
converts QuantizeLinear/DequantizeLinear and the float ops). The int32 bias of QLinearConv and
QGemm is dequantized with scale x_scale * w_scale (zero point 0), as the spec defines it.
onnxruntime requantizes the exact int32 accumulator; here the float op's rounding can move
a value across a rounding boundary: results agree to one quantization step."""

from __future__ import annotations

import onnx
from onnx import helper

from .onnx_graph import node_attrs

MS = "com.microsoft"


class _Writer:
    def __init__(self, node: onnx.NodeProto, fresh):
        self.node, self.fresh, self.nodes = node, fresh, []

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def dequantize(self, x: str, scale: str, zero: str = "", axis: int | None = None) -> str:
        inputs = [x, scale] + ([zero] if zero else [])
        return self.op("DequantizeLinear", inputs, **({"axis": axis} if axis is not None else {}))

    def quantize(self, y: str, scale: str, zero: str) -> str:
        return self.op("QuantizeLinear", [y, scale] + ([zero] if zero else []),
                       self.node.output[0])

    def bias(self, b: str, x_scale: str, w_scale: str) -> str:
        return self.dequantize(b, self.op("Mul", [x_scale, w_scale]), axis=0)


def _input(node, k: int) -> str:
    return node.input[k] if len(node.input) > k else ""


def qlinear_conv(node, fresh):
    w = _Writer(node, fresh)
    x = w.dequantize(node.input[0], node.input[1], node.input[2])
    weight = w.dequantize(node.input[3], node.input[4], node.input[5], axis=0)
    inputs = [x, weight] + ([w.bias(node.input[8], node.input[1], node.input[4])]
                            if _input(node, 8) else [])
    y = w.op("Conv", inputs, **node_attrs(node))
    w.quantize(y, node.input[6], node.input[7])
    return w.nodes


def conv_integer(node, fresh):
    """ConvInteger(x, w, x_zp?, w_zp?) -> int32: the zero points subtracted in float32, the
    convolution in float32 (products of 8-bit values are exact; sums are exact below 2^24 and
    within float32 rounding above, which the float scale that follows in a dynamic-quantized
    graph makes irrelevant), rounded back to int32."""
    w = _Writer(node, fresh)

    def centred(k_value: int, k_zero: int, axis_zero_per_channel: bool) -> str:
        value = w.op("Cast", [node.input[k_value]], to=onnx.TensorProto.FLOAT)
        if not _input(node, k_zero):
            return value
        zero = w.op("Cast", [node.input[k_zero]], to=onnx.TensorProto.FLOAT)
        if axis_zero_per_channel:  # w_zp may be per output channel: [M] -> [M, 1, 1, 1]
            zero = w.op("Reshape", [zero, w.op("Constant", [], value=helper.make_tensor(
                fresh("shape"), onnx.TensorProto.INT64, [4], [-1, 1, 1, 1]))])
        return w.op("Sub", [value, zero])
    x, weight = centred(0, 2, False), centred(1, 3, True)
    y = w.op("Round", [w.op("Conv", [x, weight], **node_attrs(node))])
    w.op("Cast", [y], node.output[0], to=onnx.TensorProto.INT32)
    return w.nodes


def qlinear_matmul(node, fresh):
    w = _Writer(node, fresh)
    a = w.dequantize(node.input[0], node.input[1], node.input[2])
    b = w.dequantize(node.input[3], node.input[4], node.input[5], axis=-1)
    w.quantize(w.op("MatMul", [a, b]), node.input[6], node.input[7])
    return w.nodes


def qgemm(node, fresh):
    """QGemm(A, a_s, a_zp, B, b_s, b_zp, C?, y_s?, y_zp?): without y_s the output is float."""
    w = _Writer(node, fresh)
    attrs = node_attrs(node)
    a = w.dequantize(node.input[0], node.input[1], node.input[2])
    b = w.dequantize(node.input[3], node.input[4], node.input[5],
                     axis=0 if attrs.get("transB", 0) else 1)
    inputs = [a, b] + ([w.bias(node.input[6], node.input[1], node.input[4])]
                       if _input(node, 6) else [])
    gemm = {k: v for k, v in attrs.items() if k in ("alpha", "transA", "transB")}
    if not _input(node, 7):
        w.op("Gemm", inputs, node.output[0], **gemm)
        return w.nodes
    w.quantize(w.op("Gemm", inputs, **gemm), node.input[7], _input(node, 8))
    return w.nodes


def _binary(op_type: str):
    def rewrite(node, fresh):
        w = _Writer(node, fresh)
        a = w.dequantize(node.input[0], node.input[1], node.input[2])
        b = w.dequantize(node.input[3], node.input[4], node.input[5])
        w.quantize(w.op(op_type, [a, b]), node.input[6], _input(node, 7))
        return w.nodes
    return rewrite


def _unary(op_type: str, keep=()):
    """QLinear<op>(X, x_s, x_zp, y_s, y_zp) with ``keep`` attributes passed to the float op;
    channels_last (NHWC) inputs are transposed around it."""
    def rewrite(node, fresh):
        w = _Writer(node, fresh)
        attrs = node_attrs(node)
        x = w.dequantize(node.input[0], node.input[1], node.input[2])
        last = attrs.get("channels_last", 0)
        x = w.op("Transpose", [x], perm=[0, 3, 1, 2]) if last else x
        y = w.op(op_type, [x], **{k: v for k, v in attrs.items() if k in keep})
        y = w.op("Transpose", [y], perm=[0, 2, 3, 1]) if last else y
        w.quantize(y, node.input[3], _input(node, 4))
        return w.nodes
    return rewrite


def qlinear_concat(node, fresh):
    """QLinearConcat(Y_s, Y_zp, X0, X0_s, X0_zp, X1, ...)."""
    w = _Writer(node, fresh)
    parts = [w.dequantize(*node.input[k:k + 3]) for k in range(2, len(node.input), 3)]
    w.quantize(w.op("Concat", parts, axis=node_attrs(node)["axis"]), node.input[0],
               node.input[1])
    return w.nodes


_POOL = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")
REWRITES = {
    ("", "QLinearConv"): qlinear_conv,
    ("", "QLinearMatMul"): qlinear_matmul,
    ("", "ConvInteger"): conv_integer,
    (MS, "QGemm"): qgemm,
    (MS, "QLinearAdd"): _binary("Add"),
    (MS, "QLinearMul"): _binary("Mul"),
    (MS, "QLinearGlobalAveragePool"): _unary("GlobalAveragePool"),
    (MS, "QLinearAveragePool"): _unary("AveragePool", _POOL),
    (MS, "QLinearSigmoid"): _unary("Sigmoid"),
    (MS, "QLinearLeakyRelu"): _unary("LeakyRelu", ("alpha",)),
    (MS, "QLinearConcat"): qlinear_concat,
}


def _key(node) -> tuple[str, str]:
    return ("" if node.domain in ("", "ai.onnx") else node.domain, node.op_type)


def handled(node) -> bool:
    return _key(node) in REWRITES


def expand_qlinear(model: onnx.ModelProto, fresh) -> onnx.ModelProto:
    """A copy of ``model`` with every quantized operator expanded (the same model when there is
    none). ``fresh(hint)`` makes unused tensor names."""
    if not any(handled(n) for n in model.graph.node):
        return model
    nodes = []
    for node in model.graph.node:
        nodes.extend(REWRITES[_key(node)](node, fresh) if handled(node) else [node])
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
