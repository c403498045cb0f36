"""compiler/frontends/onnx_graph.py: shape inference without the weights' data, constants read
on first use."""

import numpy as np
import onnx
from onnx import helper as h
from onnx import numpy_helper as nh

from aotc.compiler.frontends import onnx_graph
from aotc.compiler.frontends.onnx_graph import GraphInfo


def _model(hidden: int = 2048) -> onnx.ModelProto:
    """x @ W (a weight far over SHAPE_ONLY_ELEMENTS) reshaped by a shape held in an
    initializer, then the shape of the result sliced (data propagation must still see it)."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "w"], ["y"]),
             h.make_node("Reshape", ["y", "shape"], ["z"]),
             h.make_node("Shape", ["z"], ["zs"]),
             h.make_node("Slice", ["zs", "start", "end"], ["tail"]),
             h.make_node("Reshape", ["z", "tail"], ["out"])]
    inits = [nh.from_array(rng.standard_normal((64, hidden)).astype(np.float32), "w"),
             nh.from_array(np.array([2, -1, 64], np.int64), "shape"),
             nh.from_array(np.array([1], np.int64), "start"),
             nh.from_array(np.array([3], np.int64), "end")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                [4, 64])],
                         [h.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_shapes_without_weights_match_full_inference():
    model = _model()
    stripped = onnx_graph._without_weights(model)
    assert [t.name for t in stripped.graph.initializer] == ["shape", "start", "end"]
    assert "w" in [v.name for v in stripped.graph.input]
    info = GraphInfo(model, 17)
    full = onnx.shape_inference.infer_shapes(model, data_prop=True)
    for value in full.graph.value_info:
        dims = [d.dim_value if d.HasField("dim_value") else None
                for d in value.type.tensor_type.shape.dim]
        assert info.shape(value.name) == dims, value.name
    assert info.shape("out") == [64, 64]  # through the sliced Shape: data propagation


def test_constants_are_read_on_first_use_only():
    model = _model()
    constants = onnx_graph.constant_values(model)
    assert sorted(constants) == ["end", "shape", "start", "w"]
    assert constants.size("w") == 64 * 2048 and not constants._values
    np.testing.assert_array_equal(constants["shape"], [2, -1, 64])
    assert list(constants._values) == ["shape"]
