"""Ops without a TVM converter that the spec defines as functions are expanded into their
bodies (compiler/frontends/onnx_functions.py) and match onnxruntime."""

import numpy as np
import onnx
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper

from aotc.compiler.frontends.onnx_functions import expand_functions
from aotc.compiler.frontends.onnx_graph import GraphInfo
from aotc.compiler.frontends.onnx_ops import ops_to_expand


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


def _sce_model():
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"],
                            reduction="mean")
    graph = helper.make_graph(
        [node], "sce",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [3, 5]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bodies_that_call_function_ops_are_expanded_again(tmp_path):
    """SoftmaxCrossEntropyLoss's body calls NegativeLogLikelihoodLoss, which TVM cannot
    convert either; TVM's importer refused it before expansion ran until nothing was left."""
    onnx.save(_sce_model(), tmp_path / "sce.onnx")
    feed = {"scores": np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32),
            "labels": np.array([0, 4, 2])}
    check_against_onnxruntime(tmp_path / "sce.onnx", tmp_path, feed=feed)


def _attention23_model():
    """ai.onnx Attention-23 (4-D q/k/v, causal). TVM registers com.microsoft's Attention
    under the same name and failed on it ('num_heads')."""
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)
    shape = [1, 2, 6, 8]
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("q", "k", "v")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_standard_attention_is_expanded_not_given_to_the_contrib_converter(tmp_path):
    model = _attention23_model()
    assert "Attention" in ops_to_expand(model)
    onnx.save(model, tmp_path / "attention.onnx")
    check_against_onnxruntime(tmp_path / "attention.onnx", tmp_path)


def test_ops_whose_tvm_converter_fails_use_the_spec_body(tmp_path):
    """RMSNormalization over axis 0 failed to lower in TVM (now expanded from its body); Elu
    on float16 mixed float32 constants in (now computed in float32). Both match onnx's
    reference."""
    from helpers import compile_and_load
    from onnx.reference import ReferenceEvaluator
    rms = helper.make_model(helper.make_graph(
        [helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=0)], "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])]),
        opset_imports=[helper.make_opsetid("", 23)])
    elu = helper.make_model(helper.make_graph(
        [helper.make_node("Elu", ["x"], ["y"], alpha=0.7)], "elu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 3, 4])]),
        opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    for name, model, dtype in (("rms", rms, np.float32), ("elu", elu, np.float16)):
        feed = {i.name: rng.standard_normal((2, 3, 4)).astype(dtype) for i in model.graph.input}
        want = ReferenceEvaluator(model).run(None, feed)[0]
        got = compile_and_load(model, tmp_path, name).run(feed)["y"]
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                   rtol=1e-3, atol=1e-3)
