"""Small ONNX graphs built with onnx.helper, for fast tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _const(name: str, shape, seed: int) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)


def tiny_cnn(opset: int = 17) -> onnx.ModelProto:
    """conv3x3(8->16)+relu -> maxpool -> global avg pool -> flatten -> gemm(16->10)."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [_const("w", (16, 8, 3, 3), 0), _const("b", (16,), 1),
         _const("fc_w", (10, 16), 2), _const("fc_b", (10,), 3)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def two_matmuls(opset: int = 17) -> onnx.ModelProto:
    """x[8,32] -> matmul(32->48)+relu -> matmul(48->16): two kernels to tune, for tests that
    check a tuner's mechanics, where every task costs reference timings (on a farm: remote
    sessions) that a six-kernel model pays six times."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "two_matmuls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])],
        [_const("w1", (32, 48), 4), _const("w2", (48, 16), 5)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def single_op(op_type: str, domain: str = "", opset: int = 17, name: str = "the_node"):
    """x -> op -> y on a [2, 3] float tensor; for op-support checks."""
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain, name=name)
    graph = helper.make_graph(
        [node], "single",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets)


def if_on_an_input() -> onnx.ModelProto:
    """A voice-activity-style switch: at 16 kHz one frame layout, else another (the branches
    give different shapes, so both cannot be computed and selected)."""
    then_graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape16"], ["frames"])], "then",
                              [], [helper.make_tensor_value_info("frames", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([4, 8], np.int64), "shape16")])
    else_graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape8"], ["frames"])], "else",
                              [], [helper.make_tensor_value_info("frames", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([2, 16], np.int64), "shape8")])
    nodes = [helper.make_node("Equal", ["sr", "sixteen"], ["is16"]),
             helper.make_node("If", ["is16"], ["frames"], then_branch=then_graph,
                         else_branch=else_graph),
             helper.make_node("Relu", ["frames"], ["y"])]
    graph = helper.make_graph(
        nodes, "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32]),
                       helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(16000, np.int64), "sixteen")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
