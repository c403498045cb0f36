"""LiftMinMaxCallTIR: the ONNX importer's Clip call_tirs become R.maximum / R.minimum, and the
model computes the same."""

import numpy as np
import onnx
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from aotc.compiler.passes import LiftMinMaxCallTIR


def _clip_model():
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])]
    graph = helper.make_graph(
        nodes, "clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
         numpy_helper.from_array(np.array(6.0, np.float32), "hi")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ops(mod):
    return mod["main"].script(show_meta=False)


def test_clip_call_tir_is_lifted_to_relax_ops():
    from tvm.relax.frontend.onnx import from_onnx
    before = relax.transform.FoldConstant()(from_onnx(_clip_model()))
    assert "R.call_tir(maximum," in _ops(before) and "R.call_tir(minimum," in _ops(before)
    after = LiftMinMaxCallTIR()(before)
    text = _ops(after)
    assert "R.maximum(" in text and "R.minimum(" in text and "call_tir" not in text
    # the PrimFuncs are gone from the module, nothing else changed
    assert not [gv for gv, f in after.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def test_lifted_model_matches_onnxruntime(tmp_path):
    path = tmp_path / "clip.onnx"
    onnx.save(_clip_model(), path)
    feed = {"x": np.linspace(-10, 10, 100, dtype=np.float32).reshape(1, 4, 5, 5)}
    check_against_onnxruntime(path, tmp_path, feed=feed)
