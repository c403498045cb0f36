"""Reductions whose axes are a run-time input (onnx_runtime_axes.py): TVM refused them; the
compiled model matches onnxruntime for every axes value, keepdims on and off, negative axes,
and stops with a named error on an axis out of range."""

import numpy as np
import onnx
import pytest
from helpers import check_against_onnxruntime, compile_and_load
from onnx import TensorProto, helper

from aotc.errors import ModelRunError

SHAPE = [2, 3, 4]


def _reduce_model(op: str, keepdims: int, n_axes: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)], "reduce",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE),
         helper.make_tensor_value_info("axes", TensorProto.INT64, [n_axes])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("op,keepdims", [("ReduceSum", 1), ("ReduceMean", 0),
                                         ("ReduceLogSumExp", 1), ("ReduceMax", 0),
                                         ("ReduceL2", 0)])
def test_runtime_axes_match_onnxruntime_for_every_axes_value(tmp_path, op, keepdims):
    path = tmp_path / f"{op}.onnx"
    onnx.save(_reduce_model(op, keepdims, 2), path)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    for axes in ([0, 2], [1, -1], [-3, 1]):
        check_against_onnxruntime(path, tmp_path, feed={"x": x, "axes": np.array(axes)})


def test_an_axis_out_of_range_is_a_named_error(tmp_path):
    model = compile_and_load(_reduce_model("ReduceSum", 1, 1), tmp_path)
    x = np.ones(SHAPE, np.float32)
    assert model.run({"x": x, "axes": np.array([1])})["y"].shape == (2, 1, 4)
    with pytest.raises(ModelRunError, match="IndexError"):
        model.run({"x": x, "axes": np.array([3])})
