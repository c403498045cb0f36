"""ReduceMax / ReduceMin over infinities: TVM's legalization used the largest finite value as
the identity (max of a row of -inf gave -3.4e38). compiler/default_schedules/exact_minmax.py
fixes it."""

import numpy as np
import onnx
import pytest
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_over_infinities_match_onnxruntime(keepdims, tmp_path):
    nodes = [helper.make_node("ReduceMax", ["a"], ["mx"], axes=[1], keepdims=keepdims),
             helper.make_node("ReduceMin", ["b"], ["mn"], axes=[0, 2], keepdims=keepdims)]
    graph = helper.make_graph(nodes, "r", [helper.make_tensor_value_info(n, TensorProto.FLOAT,
                                                                         [2, 3, 4])
                                           for n in ("a", "b")],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in ("mx", "mn")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "r.onnx")
    a, b = np.random.default_rng(0).standard_normal((2, 2, 3, 4)).astype(np.float32)
    a[0, :, 1] = -np.inf      # a reduced row of -inf for the max
    b[:, 1, :] = np.inf       # a reduced slice of +inf for the min
    model, got = check_against_onnxruntime(tmp_path / "r.onnx", tmp_path, feed={"a": a, "b": b})
    assert np.isneginf(got["mx"]).any() and np.isposinf(got["mn"]).any()
    assert model.metadata["unscheduled_kernels"] == []
