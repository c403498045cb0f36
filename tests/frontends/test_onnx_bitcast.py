"""BitCast (no TVM converter, no Relax op): a reinterpreting kernel; results equal numpy's
view of the same bits, for floats, half floats and bool."""

import numpy as np
import pytest
from helpers import compile_and_load
from onnx import TensorProto, helper


@pytest.mark.parametrize("src,dst,values", [
    (TensorProto.FLOAT, TensorProto.INT32, np.array([[1.5, -0.0], [np.inf, 3e-39]], np.float32)),
    (TensorProto.FLOAT16, TensorProto.UINT16, np.array([1, -2, 65504], np.float16)),
    (TensorProto.BOOL, TensorProto.UINT8, np.array([True, False, True])),
])
def test_bitcast_equals_numpy_view(tmp_path, src, dst, values):
    graph = helper.make_graph(
        [helper.make_node("BitCast", ["x"], ["y"], to=dst)], "bitcast",
        [helper.make_tensor_value_info("x", src, list(values.shape))],
        [helper.make_tensor_value_info("y", dst, list(values.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    got = compile_and_load(model, tmp_path).run({"x": values})["y"]
    want = values.view(helper.tensor_dtype_to_np_dtype(dst))
    np.testing.assert_array_equal(got, want)
