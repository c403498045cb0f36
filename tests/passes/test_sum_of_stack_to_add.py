"""SumOfStackToAdd: the importer's stack+sum for ONNX ``Sum`` becomes plain adds (so that
ConvertLayout can handle the model), other stack/sum uses stay, and outputs do not change."""

import numpy as np
import onnx
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper
from tvm.script import relax as R

from aotc.compiler.passes import SumOfStackToAdd

SHAPE = [1, 4, 5, 5]


def _sum_model():
    graph = helper.make_graph(
        [helper.make_node("Sum", ["a", "b", "c"], ["y"])], "sum",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in "abc"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _text(mod):
    return mod["main"].script(show_meta=False)


def test_onnx_sum_becomes_adds():
    from tvm.relax.frontend.onnx import from_onnx
    before = from_onnx(_sum_model())
    assert "R.stack(" in _text(before) and "R.sum(" in _text(before)
    after = SumOfStackToAdd()(before)
    text = _text(after)
    assert "R.stack(" not in text and "R.sum(" not in text
    assert text.count("R.add(") == 2


def test_sum_over_another_axis_is_left_alone():
    @R.function
    def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            s = R.stack((a, b), axis=0)
            y = R.sum(s, axis=[1], keepdims=False)
            R.output(y)
        return y

    import tvm
    before = tvm.IRModule({"main": main})
    after = SumOfStackToAdd()(before)
    tvm.ir.assert_structural_equal(after, before)


def test_rewritten_model_matches_onnxruntime(tmp_path):
    path = tmp_path / "sum.onnx"
    onnx.save(_sum_model(), path)
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal(SHAPE).astype(np.float32) for n in "abc"}
    check_against_onnxruntime(path, tmp_path, feed=feed)
