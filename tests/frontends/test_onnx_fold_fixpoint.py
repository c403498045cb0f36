"""Shape folding runs to a fixpoint: a value folded in one round makes a shape static that only
the next round's shape inference sees (a YOLO-style anchor head: Shape -> Gather -> Cast ->
arithmetic -> Range, whose length decides a later Shape -> Concat -> Expand). One round left
the Expand with a run-time shape, and the compile was refused."""

import numpy as np
import onnx
from helpers import check_against_onnxruntime
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from aotc.compiler.frontends.onnx_fold import fold_constants
from aotc.compiler.frontends.onnx_graph import GraphInfo
from aotc.compiler.frontends.onnx_loader import fold_to_fixpoint


def _const(name, value):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.asarray(value), name))


def anchor_head() -> onnx.ModelProto:
    """x [1, 3, 8, 8] -> anchors [2, 16] + 1 (16 = ceil(8 / 2) ** 2 from x's height), and
    x @ grid [1, 3, 64, 16]."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]), _const("i2", np.array(2, np.int64)),
        h.make_node("Gather", ["s", "i2"], ["height"]),
        h.make_node("Cast", ["height"], ["height_f"], to=TP.FLOAT),
        _const("zero", np.float32(0)), _const("one", np.float32(1)),
        _const("half", np.float32(0.5)),
        h.make_node("Mul", ["height_f", "half"], ["halved"]),
        h.make_node("Ceil", ["halved"], ["cells"]),
        h.make_node("Mul", ["cells", "cells"], ["count"]),
        h.make_node("Range", ["zero", "count", "one"], ["grid"]),
        _const("axis0", np.array([0], np.int64)),
        h.make_node("Unsqueeze", ["grid", "axis0"], ["grid_row"]),
        _const("column", np.array([1, 3, 64, 1], np.int64)),
        h.make_node("Reshape", ["x", "column"], ["x_column"]),
        h.make_node("MatMul", ["x_column", "grid_row"], ["scaled"]),
        h.make_node("Shape", ["scaled"], ["scaled_shape"]),
        _const("start", np.array([3], np.int64)), _const("end", np.array([4], np.int64)),
        h.make_node("Slice", ["scaled_shape", "start", "end"], ["last"]),
        _const("lead", np.array([2], np.int64)),
        h.make_node("Concat", ["lead", "last"], ["target"], axis=0),
        h.make_node("Expand", ["base", "target"], ["anchors"]),
        h.make_node("Add", ["anchors", "one"], ["y"]),
    ]
    graph = h.make_graph(
        nodes, "anchor_head", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8])],
        [h.make_tensor_value_info("y", TP.FLOAT, None),
         h.make_tensor_value_info("scaled", TP.FLOAT, None)],
        [nh.from_array(np.arange(16, dtype=np.float32).reshape(1, 16), "base")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _left(model):
    return [n.op_type for n in model.graph.node if n.op_type != "Constant"]


def test_one_round_leaves_the_expand_and_the_fixpoint_folds_it():
    model = anchor_head()
    once, _ = fold_constants(model, GraphInfo(model, 17))
    assert _left(once) == ["Reshape", "MatMul", "Shape", "Slice", "Concat", "Expand", "Add"]
    assert _left(model) == ["Shape", "Gather", "Cast", "Mul", "Ceil", "Mul", "Range",
                            "Unsqueeze", "Reshape", "MatMul", "Shape", "Slice", "Concat",
                            "Expand", "Add"]  # fold_constants left it as it was
    fixed = fold_to_fixpoint(model, lambda m: GraphInfo(m, 17))
    assert _left(fixed) == ["Reshape", "MatMul"]  # the anchors are one constant
    assert fixed is model  # folded in place


def test_anchor_head_compiles_and_matches_onnxruntime(tmp_path):
    onnx.save(anchor_head(), tmp_path / "anchor_head.onnx")
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    check_against_onnxruntime(tmp_path / "anchor_head.onnx", tmp_path, feed={"x": x})
