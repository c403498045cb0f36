"""CumSum / Split / TopK / Reshape with run-time axis, sizes, k and shape
(onnx_runtime_params.py): TVM refused all four; they match onnxruntime for several values,
and a run-time shape or split that does not fit the data is a named error, not a read past it
(before the check, Reshape of 6 elements to [400, 200] returned 80,000 values)."""

import numpy as np
import onnx
import pytest
from helpers import check_against_onnxruntime, compile_and_load
from onnx import TensorProto, helper

from aotc.errors import ModelRunError


def _model(node, inputs, n_outputs=1, opset=18):
    graph = helper.make_graph(
        [node], node.op_type,
        [helper.make_tensor_value_info(name, elem, shape) for name, elem, shape in inputs],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT if i == 0 else
                                       TensorProto.INT64, None) for i in range(n_outputs)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


X = ("x", TensorProto.FLOAT, [3, 4])
DATA = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5 - 2


def _check(tmp_path, model, feeds):
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    for feed in feeds:
        check_against_onnxruntime(path, tmp_path, feed={"x": DATA, **feed})


def test_cumsum_runtime_axis(tmp_path):
    node = helper.make_node("CumSum", ["x", "axis"], ["y0"], reverse=1)
    model = _model(node, [X, ("axis", TensorProto.INT64, [])])
    _check(tmp_path, model, [{"axis": np.array(a)} for a in (0, 1, -1)])


def test_split_runtime_sizes(tmp_path):
    node = helper.make_node("Split", ["x", "split"], ["y0", "y1"], axis=1)
    model = _model(node, [X, ("split", TensorProto.INT64, [2])], n_outputs=1)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    model.graph.output.append(helper.make_tensor_value_info("y1", TensorProto.FLOAT, None))
    _check(tmp_path, model, [{"split": np.array(s)} for s in ([1, 3], [4, 0])])
    compiled = compile_and_load(tmp_path / "model.onnx", tmp_path, "split")
    with pytest.raises(ModelRunError, match="split sizes"):
        compiled.run({"x": DATA, "split": np.array([3, 3])})


def test_top_k_runtime_k(tmp_path):
    node = helper.make_node("TopK", ["x", "k"], ["y0", "y1"], axis=1)
    model = _model(node, [X, ("k", TensorProto.INT64, [1])], n_outputs=2)
    _check(tmp_path, model, [{"k": np.array([k])} for k in (1, 3)])


def test_reshape_runtime_shape(tmp_path):
    node = helper.make_node("Reshape", ["x", "shape"], ["y0"])
    model = _model(node, [X, ("shape", TensorProto.INT64, [3])])
    _check(tmp_path, model, [{"shape": np.array(s)} for s in ([2, -1, 3], [0, 2, 2])])
    compiled = compile_and_load(tmp_path / "model.onnx", tmp_path, "reshape")
    for bad in ([400, 200, 1], [-2, -3, -2]):
        with pytest.raises(ModelRunError, match="does not hold the data's 12 elements"):
            compiled.run({"x": DATA, "shape": np.array(bad)})


def _resize_model(arg: str, mode: str, antialias: int = 0):
    inputs = ["x", "", "scales"] if arg == "scales" else ["x", "", "", "sizes"]
    node = helper.make_node("Resize", inputs, ["y0"], mode=mode, antialias=antialias)
    kind = TensorProto.FLOAT if arg == "scales" else TensorProto.INT64
    return _model(node, [("x", TensorProto.FLOAT, [1, 2, 4, 4]), (arg, kind, [4])], opset=19)


IMAGE = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_runtime_sizes_and_scales(tmp_path, mode):
    for arg, values in (("sizes", [[1, 2, 8, 12], [1, 2, 2, 4]]),
                        ("scales", [[1, 1, 2, 3], [1, 1, 0.5, 1]])):
        path = tmp_path / f"resize_{arg}.onnx"
        onnx.save(_resize_model(arg, mode), path)
        kind = np.float32 if arg == "scales" else np.int64
        for v in values:
            check_against_onnxruntime(path, tmp_path, feed={"x": IMAGE, arg: np.array(v, kind)})


def test_resize_values_tvm_gets_wrong_are_named_errors(tmp_path):
    nearest = compile_and_load(_resize_model("sizes", "nearest"), tmp_path, "nearest")
    with pytest.raises(ModelRunError, match="multiple or a divisor"):
        nearest.run({"x": IMAGE, "sizes": np.array([1, 2, 7, 8])})  # 4 -> 7: ties go wrong
    linear = compile_and_load(_resize_model("scales", "linear"), tmp_path, "linear")
    with pytest.raises(ModelRunError, match="whole output sizes"):
        linear.run({"x": IMAGE, "scales": np.array([1, 1, 0.6, 1], np.float32)})


def test_resize_antialias_is_refused_by_name(tmp_path):
    from aotc.errors import UnsupportedModelError
    with pytest.raises(UnsupportedModelError, match="antialias=1 is ignored"):
        compile_and_load(_resize_model("sizes", "linear", antialias=1), tmp_path)


def test_one_hot_runtime_depth(tmp_path):
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y0"], axis=1)
    graph = helper.make_graph(
        [node], "onehot",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3]),
         helper.make_tensor_value_info("depth", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(np.array([-1, 5], np.float32), "values")])
    path = tmp_path / "onehot.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), path)
    indices = np.array([[0, 2, -1], [1, 7, -3]])
    for depth in (3, 8):
        check_against_onnxruntime(path, tmp_path, feed={"i": indices, "depth": np.array(depth)})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_runtime_pads(tmp_path, mode):
    node = helper.make_node("Pad", ["x", "pads", "value"], ["y0"], mode=mode)
    graph = helper.make_graph(
        [node], "pad", [helper.make_tensor_value_info(*X),
                        helper.make_tensor_value_info("pads", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(np.array(7.5, np.float32), "value")])
    path = tmp_path / "pad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    cases = [[1, 2, 0, 1], [0, -1, 2, 0]] if mode != "wrap" else [[1, 2, 0, 1]]
    for pads in cases:
        check_against_onnxruntime(path, tmp_path, feed={"x": DATA, "pads": np.array(pads)})


def test_cumprod_constant_and_runtime_axis(tmp_path):
    """CumProd has no TVM converter; aotc's handles constant and run-time axes, exclusive and
    reverse."""
    node = helper.make_node("CumProd", ["x", "axis"], ["y0"], exclusive=1, reverse=1)
    model = _model(node, [X, ("axis", TensorProto.INT64, [])], opset=26)
    _check(tmp_path, model, [{"axis": np.array(a)} for a in (0, -1)])
