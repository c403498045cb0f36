"""A ModelProto handed to compile is the caller's: the import folds and rewrites its own copy."""

import numpy as np
import onnx
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper

import aotc


def _reshape_to_own_shape() -> onnx.ModelProto:
    """Shape -> Reshape over an input with a symbolic batch: the import folds Shape into a
    constant of the shape it is compiled for."""
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"]),
         helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_compile_leaves_the_callers_model_as_it_was(tmp_path):
    model = _reshape_to_own_shape()
    before = model.SerializeToString()
    aotc.compile(model, output=tmp_path / "a.so", input_shapes={"x": (2, 3)})
    assert model.SerializeToString() == before
    assert [n.op_type for n in model.graph.node] == ["Shape", "Reshape", "Relu"]
    # compiled again for another batch, the same proto gives that batch's right answer
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    aotc.compile(model, output=tmp_path / "b.so", input_shapes={"x": (4, 3)})
    check_against_onnxruntime(path, tmp_path, feed={"x": x}, compiled=tmp_path / "b.so")
