"""Scan is unrolled (onnx_scan.py): TVM has no converter for it. A running sum with a state,
a scan input read in reverse along axis 1 and an output stacked on axis 1 matches
onnxruntime; the unrolled graph has no Scan left and one body copy per step."""

import numpy as np
import onnx
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper

from aotc.compiler.frontends.onnx_graph import GraphInfo
from aotc.compiler.frontends.onnx_scan import unroll_scan

STEPS = 5


def _scan_model() -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x_t"], ["acc_out"]),
         helper.make_node("Mul", ["acc_out", "two"], ["y_t"])], "body",
        [helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [2, 3])],
        initializer=[onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    scan = helper.make_node("Scan", ["init", "xs"], ["final", "ys"], body=body,
                            num_scan_inputs=1, scan_input_axes=[1],
                            scan_input_directions=[1], scan_output_axes=[-1])
    graph = helper.make_graph(
        [scan], "scan",
        [helper.make_tensor_value_info("init", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("xs", TensorProto.FLOAT, [2, STEPS, 3])],
        [helper.make_tensor_value_info("final", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, [2, 3, STEPS])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_scan_is_unrolled_one_body_per_step():
    model = _scan_model()
    nodes = unroll_scan(model.graph.node[0], GraphInfo(model, 17))
    ops = [n.op_type for n in nodes]
    assert "Scan" not in ops
    assert ops.count("Add") == STEPS and ops.count("Mul") == STEPS


def test_reverse_scan_with_state_matches_onnxruntime(tmp_path):
    onnx.save(_scan_model(), tmp_path / "scan.onnx")
    check_against_onnxruntime(tmp_path / "scan.onnx", tmp_path)
