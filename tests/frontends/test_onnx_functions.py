"""Ops without a TVM converter that the spec defines as functions are expanded into their
bodies (compiler/frontends/onnx_functions.py) and match onnxruntime."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from aotc.compiler.frontends.onnx_functions import expand_functions
from aotc.compiler.frontends.onnx_graph import GraphInfo
from aotc.compiler.frontends.onnx_ops import ops_to_expand
from helpers import check_against_onnxruntime


def _nll_model():
    node = helper.make_node("NegativeLogLikelihoodLoss", ["scores", "target", "weight"], ["loss"],
                            reduction="mean", ignore_index=1)
    graph = helper.make_graph(
        [node], "nll",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [4, 5]),
         helper.make_tensor_value_info("target", TensorProto.INT64, [4]),
         helper.make_tensor_value_info("weight", TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_function_ops_are_expanded_into_converted_ops():
    model = _nll_model()
    assert ops_to_expand(model) == {"NegativeLogLikelihoodLoss"}
    expanded = expand_functions(model, GraphInfo(model, 17), {"NegativeLogLikelihoodLoss"})
    ops = {n.op_type for n in expanded.graph.node}
    assert "NegativeLogLikelihoodLoss" not in ops and "GatherElements" in ops
    assert [o.domain for o in expanded.opset_import] == [""]


def test_expanded_loss_matches_onnxruntime(tmp_path):
    onnx.save(_nll_model(), tmp_path / "nll.onnx")
    rng = np.random.default_rng(0)
    feed = {"scores": rng.standard_normal((4, 5)).astype(np.float32),
            "target": np.array([0, 1, 4, 2]),
            "weight": rng.random(5).astype(np.float32)}
    check_against_onnxruntime(tmp_path / "nll.onnx", tmp_path, feed=feed)
