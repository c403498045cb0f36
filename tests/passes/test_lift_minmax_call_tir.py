"""LiftMinMaxCallTIR: the ONNX importer's Clip call_tirs become R.maximum / R.minimum, and the
model computes the same."""

import numpy as np
import onnx
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from relax_helpers import main_ops, run_main
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from aotc.compiler.passes import LiftMinMaxCallTIR


def _clip_model():
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])]
    graph = helper.make_graph(
        nodes, "clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
         numpy_helper.from_array(np.array(6.0, np.float32), "hi")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@I.ir_module
class Expected:
    """The importer's Clip(0, 6) as Relax ops: no call_tir, no PrimFunc left in the module."""

    @R.function
    def main(x: R.Tensor((1, 4, 5, 5), "float32")) -> R.Tensor((1, 4, 5, 5), "float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            low = R.maximum(x, R.const(0.0, "float32"))
            gv = R.minimum(low, R.const(6.0, "float32"))
            R.output(gv)
        return gv


def test_clip_call_tir_is_lifted_to_relax_ops():
    from tvm.relax.frontend.onnx import from_onnx
    before = relax.transform.FoldConstant()(from_onnx(_clip_model()))
    assert main_ops(before) == ["relax.call_tir", "relax.call_tir"]
    after = LiftMinMaxCallTIR()(before)
    tvm.ir.assert_structural_equal(after, Expected)
    x = np.linspace(-10, 10, 100, dtype=np.float32).reshape(1, 4, 5, 5)
    np.testing.assert_array_equal(run_main(after, x), np.clip(x, 0, 6))


def test_lifted_model_matches_onnxruntime(tmp_path):
    path = tmp_path / "clip.onnx"
    onnx.save(_clip_model(), path)
    feed = {"x": np.linspace(-10, 10, 100, dtype=np.float32).reshape(1, 4, 5, 5)}
    check_against_onnxruntime(path, tmp_path, feed=feed)
