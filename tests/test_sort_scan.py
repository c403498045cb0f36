"""Sort, top-k and scans compile: they need TVM's DispatchSortScan before legalization, which
the pipeline did not run ("CodeGenVM cannot emit R.topk", "R.cumsum", "R.argsort")."""

import numpy as np
import onnx
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper, numpy_helper


def test_topk_and_cumsum_match_onnxruntime(tmp_path):
    nodes = [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1),
             helper.make_node("CumSum", ["x", "axis"], ["running"])]
    graph = helper.make_graph(
        nodes, "sort_scan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 10])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, [3, 4]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, [3, 4]),
         helper.make_tensor_value_info("running", TensorProto.FLOAT, [3, 10])],
        [numpy_helper.from_array(np.array([4], np.int64), "k"),
         numpy_helper.from_array(np.array(1, np.int64), "axis")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "ss.onnx")
    x = np.random.default_rng(0).permutation(30).reshape(3, 10).astype(np.float32)
    check_against_onnxruntime(tmp_path / "ss.onnx", tmp_path, feed={"x": x})
