"""ONNX-level rewrites and folding: the graph after each (op types present, constants made),
and the compiled model against onnxruntime on the original graph. Before these, each case
compiled and gave a silent wrong answer, or failed in TVM's importer."""

import numpy as np
import onnx
import pytest
from helpers import check_against_onnxruntime, compile_and_load
from onnx import TensorProto, helper, numpy_helper

import aotc
from aotc.compiler.frontends.onnx_fold import fold_constants
from aotc.compiler.frontends.onnx_graph import GraphInfo, with_fixed_inputs
from aotc.compiler.frontends.onnx_rewrites import apply_rewrites, output_shape_pads
from aotc.errors import UnsupportedModelError

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _rewritten_ops(model, shapes=None):
    info = GraphInfo(with_fixed_inputs(model, shapes or {}), model.opset_import[0].version)
    after, counts = apply_rewrites(model, info)
    return [n.op_type for n in after.graph.node], counts


def _check(model, tmp_path, feed, name, **kw):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return check_against_onnxruntime(path, tmp_path, feed=feed, **kw)


def test_layer_norm_statistics(tmp_path):
    model = _model([helper.make_node("LayerNormalization", ["x", "w", "b"], ["y", "m", "s"],
                                     axis=1)],
                   [_vi("x", F, [2, 3, 4])],
                   [_vi("y", F, [2, 3, 4]), _vi("m", F, [2, 1, 1]), _vi("s", F, [2, 1, 1])],
                   [numpy_helper.from_array(np.ones((3, 4), np.float32), "w"),
                    numpy_helper.from_array(np.zeros((3, 4), np.float32), "b")])
    ops, counts = _rewritten_ops(model)
    assert counts == {"LayerNormalization": 1}
    assert ops.count("LayerNormalization") == 1 and "ReduceMean" in ops and "Reciprocal" in ops
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    _, got = _check(model, tmp_path, {"x": x}, "ln")
    assert got["m"].shape == (2, 1, 1)  # TVM gave a scalar


def test_dropout_mask_is_bool(tmp_path):
    model = _model([helper.make_node("Dropout", ["x"], ["y", "mask"])],
                   [_vi("x", F, [2, 3])],
                   [_vi("y", F, [2, 3]), _vi("mask", TensorProto.BOOL, [2, 3])])
    assert "Dropout" not in _rewritten_ops(model)[0]
    _, got = _check(model, tmp_path, {"x": np.ones((2, 3), np.float32)}, "dropout")
    assert got["mask"].dtype == np.bool_ and got["mask"].all()


@pytest.mark.parametrize("attrs", [dict(detect_negative=0), dict(detect_positive=0),
                                   dict(detect_negative=0, detect_positive=0)])
def test_isinf_directions(attrs, tmp_path):
    model = _model([helper.make_node("IsInf", ["x"], ["y"], **attrs)],
                   [_vi("x", F, [6])], [_vi("y", TensorProto.BOOL, [6])], opset=20)
    x = np.array([-1.7, np.nan, np.inf, -3.6, -np.inf, np.inf], np.float32)
    _check(model, tmp_path, {"x": x}, "isinf_" + "_".join(attrs))


@pytest.mark.parametrize("op", ["Mish", "Softplus"])
def test_precise_near_zero(op, tmp_path):
    model = _model([helper.make_node(op, ["x"], ["y"])], [_vi("x", F, [1000])],
                   [_vi("y", F, [1000])], opset=22)
    x = np.linspace(-30, 30, 1000).astype(np.float32)
    _check(model, tmp_path, {"x": x}, op, rtol=1e-5, atol=1e-8)


def test_conv_transpose_output_shape(tmp_path):
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[3, 2],
                            output_shape=[10, 8])
    model = _model([node], [_vi("x", F, [1, 1, 3, 3])], [_vi("y", F, [1, 2, 10, 8])],
                   [numpy_helper.from_array(np.ones((1, 2, 3, 3), np.float32), "w")])
    after = apply_rewrites(model, GraphInfo(model, 17))[0].graph.node[0]
    assert {a.name for a in after.attribute} >= {"pads", "output_padding"}
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    _, got = _check(model, tmp_path, {"x": x}, "convt")
    assert got["y"].shape == (1, 2, 10, 8)


def test_output_shape_pads_follow_the_spec():
    # ONNX's example: 3*(3-1) + 3 = 9 < 10 and 2*(3-1) + 3 = 7 < 8: output_padding 1 each
    assert output_shape_pads({"output_shape": [10, 8], "strides": [3, 2]}, [3, 3], [3, 3]) == (
        [0, 0, 0, 0], [1, 1])
    # total padding 3 with NOTSET: the odd one at the beginning; SAME_UPPER: at the end
    assert output_shape_pads({"output_shape": [6]}, [5], [5]) == ([2, 1], [0])
    assert output_shape_pads({"output_shape": [6], "auto_pad": b"SAME_UPPER"}, [5], [5]) == (
        [1, 2], [0])


def _expand_model(shape_as_input: bool):
    shape = numpy_helper.from_array(np.array([2, 1, 6], np.int64), "s")
    inputs = [_vi("x", F, [3, 1])] + ([_vi("s", TensorProto.INT64, [3])] if shape_as_input else [])
    return _model([helper.make_node("Expand", ["x", "s"], ["y"])], inputs, [_vi("y", F, None)],
                  [] if shape_as_input else [shape])


def test_expand_broadcasts_both_ways(tmp_path):
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    _, got = _check(_expand_model(False), tmp_path, {"x": x}, "expand")
    assert got["y"].shape == (2, 3, 6)  # TVM gave [2, 1, 6]


@pytest.mark.parametrize("shape", [[2, 1, 6], [1, 1, 1], [3, 4]])
def test_expand_to_a_run_time_shape_broadcasts_both_ways(tmp_path, shape):
    """The shape is an input: the target is computed when the model runs (a 1 in the shape
    keeps the data's dim). It was refused; TVM alone broadcasts one way ([2, 1, 6] on [3, 1]
    is [2, 3, 6], not [2, 1, 6])."""
    model = _expand_model(True)
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = len(shape)
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    _, got = _check(model, tmp_path, {"x": x, "s": np.array(shape, np.int64)}, "expand_dyn")
    assert got["y"].shape == np.broadcast_shapes((3, 1), tuple(shape))


def test_bitshift_out_of_range_follows_onnx(tmp_path):
    model = _model([helper.make_node("BitShift", ["x", "y"], ["z"], direction="RIGHT")],
                   [_vi("x", TensorProto.UINT32, [4]), _vi("y", TensorProto.UINT32, [4])],
                   [_vi("z", TensorProto.UINT32, [4])], opset=11)
    feed = {"x": np.array([16, 4, 1, 7], np.uint32), "y": np.array([1, 2, 0, 3], np.uint32)}
    _check(model, tmp_path, feed, "bitshift")


def test_shape_arithmetic_folds_to_constants(tmp_path):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as older torch exports write a
    flatten; TVM's importer refused it ("Reshape requires the input new shape to be Shape")."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    model = _model(nodes, [_vi("x", F, ["batch", 3, 4])], [_vi("y", F, None)], inits)
    fixed = with_fixed_inputs(model, {"x": (2, 3, 4)})
    folded, count = fold_constants(model, GraphInfo(fixed, 17))
    assert count == 4
    assert [n.op_type for n in folded.graph.node] == ["Constant"] * 4 + ["Reshape"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    _check(model, tmp_path, {"x": x}, "flatten", input_shapes={"x": (2, 3, 4)})


def test_symbolic_shapes_are_not_folded():
    model = _model([helper.make_node("Shape", ["x"], ["y"])], [_vi("x", F, ["n", 3])],
                   [_vi("y", TensorProto.INT64, [2])])
    assert fold_constants(model, GraphInfo(model, 17))[1] == 0


def test_conv_transpose_output_shape_without_static_shapes_is_refused(tmp_path):
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], output_shape=[10, 8])
    model = _model([node], [_vi("x", F, ["n", 1, "h", "w_"]), _vi("w", F, [1, 2, 3, 3])],
                   [_vi("y", F, None)])
    path = tmp_path / "convt_dyn.onnx"
    onnx.save(model, path)
    with pytest.raises(UnsupportedModelError, match="output_shape needs static input"):
        compile_and_load(path, tmp_path)


def _constant_resize(sizes, mode="nearest", **attrs):
    init = [onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes")]
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, **attrs)
    graph = helper.make_graph(
        [node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_nearest_resize_ties_tvm_rounds_wrong_are_refused(tmp_path):
    """2 -> 7 puts output row 3 exactly halfway (0.5); TVM's float32 ratio made it 0.5000001
    and picked the other row, silently."""
    with pytest.raises(UnsupportedModelError, match="exactly halfway"):
        aotc.compile(_constant_resize([1, 1, 7, 4]), target="x86", output=tmp_path / "a.so")
    path = tmp_path / "ok.onnx"  # 2 -> 1, 4 -> 8: halfway points are computed exactly
    onnx.save(_constant_resize([1, 1, 1, 8]), path)
    check_against_onnxruntime(path, tmp_path)


def test_resize_attributes_tvm_ignores_are_refused(tmp_path):
    for attrs in ({"axes": [2, 3]}, {"keep_aspect_ratio_policy": "not_larger"}):
        model = _constant_resize([4, 8] if "axes" in attrs else [1, 1, 4, 8], **attrs)
        with pytest.raises(UnsupportedModelError, match="ignored by TVM"):
            aotc.compile(model, target="x86", output=tmp_path / "b.so")


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_matches_onnxruntime(tmp_path, p):
    graph = helper.make_graph(
        [helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=p)], "lpnorm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 3])])
    path = tmp_path / "lpnorm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    check_against_onnxruntime(path, tmp_path)


def test_a_model_with_nothing_to_rewrite_is_not_copied():
    """A copy would hold every weight again (BERT-base: 435 MB, seconds of a compile)."""
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", F, [2, 3])],
                   [_vi("y", F, [2, 4])],
                   [numpy_helper.from_array(np.ones((3, 4), np.float32), "w")])
    after, counts = apply_rewrites(model, GraphInfo(model, 17))
    assert after is model and counts == {}
