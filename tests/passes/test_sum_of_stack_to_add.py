"""SumOfStackToAdd: the importer's stack+sum for ONNX ``Sum`` becomes plain adds (so that
ConvertLayout can handle the model), other stack/sum uses stay, and outputs do not change."""

import numpy as np
import onnx
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper
from relax_helpers import main_ops
from tvm.script import ir as I
from tvm.script import relax as R

from aotc.compiler.passes import SumOfStackToAdd

SHAPE = [1, 4, 5, 5]


def _sum_model():
    graph = helper.make_graph(
        [helper.make_node("Sum", ["a", "b", "c"], ["y"])], "sum",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in "abc"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


T = R.Tensor((1, 4, 5, 5), "float32")


@I.ir_module
class Expected:
    """ONNX Sum(a, b, c) as the importer writes it (each input broadcast to the common shape,
    RemoveIdentityBroadcast's job), with its stack + sum over the stacked axis made two adds."""

    @R.function
    def main(a: T, b: T, c: T) -> T:
        R.func_attr({"num_input": 3})
        with R.dataflow():
            a1 = R.broadcast_to(a, R.shape([1, 4, 5, 5]))
            b1 = R.broadcast_to(b, R.shape([1, 4, 5, 5]))
            c1 = R.broadcast_to(c, R.shape([1, 4, 5, 5]))
            ab = R.add(a1, b1)
            gv = R.add(ab, c1)
            R.output(gv)
        return gv


def test_onnx_sum_becomes_adds():
    from tvm.relax.frontend.onnx import from_onnx
    before = from_onnx(_sum_model())
    assert {"relax.stack", "relax.sum"} <= set(main_ops(before))
    tvm.ir.assert_structural_equal(SumOfStackToAdd()(before), Expected)


def test_sum_over_another_axis_is_left_alone():
    @R.function
    def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            s = R.stack((a, b), axis=0)
            y = R.sum(s, axis=[1], keepdims=False)
            R.output(y)
        return y

    before = tvm.IRModule({"main": main})
    after = SumOfStackToAdd()(before)
    tvm.ir.assert_structural_equal(after, before)


def test_rewritten_model_matches_onnxruntime(tmp_path):
    path = tmp_path / "sum.onnx"
    onnx.save(_sum_model(), path)
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal(SHAPE).astype(np.float32) for n in "abc"}
    check_against_onnxruntime(path, tmp_path, feed=feed)
