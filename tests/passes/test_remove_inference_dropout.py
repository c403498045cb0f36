"""RemoveInferenceDropout: dropout(x)[0] becomes x; a dropout whose mask is used stays; the
compiled model matches onnxruntime (where Dropout is the identity at inference)."""

import onnx
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper
from tvm.script import relax as R

from aotc.compiler.passes import RemoveInferenceDropout


def _dropout_model():
    graph = helper.make_graph(
        [helper.make_node("Dropout", ["x"], ["d"]), helper.make_node("Relu", ["d"], ["y"])],
        "dropout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dropout_output_becomes_its_input():
    from tvm.relax.frontend.onnx import from_onnx

    @R.function
    def expected(x: R.Tensor((1, 8, 4, 4), "float32")) -> R.Tensor((1, 8, 4, 4), "float32"):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            gv = R.nn.relu(x)
            R.output(gv)
        return gv

    after = RemoveInferenceDropout()(from_onnx(_dropout_model()))
    tvm.ir.assert_structural_equal(after["main"], expected.with_attr("global_symbol", "main"))


def test_dropout_whose_mask_is_used_stays():
    @R.function
    def main(x: R.Tensor((2, 3), "float32")):
        with R.dataflow():
            d = R.nn.dropout(x, rate=0.5)
            mask = d[1]
            R.output(mask)
        return mask

    before = tvm.IRModule({"main": main})
    tvm.ir.assert_structural_equal(RemoveInferenceDropout()(before), before)


def test_model_with_dropout_matches_onnxruntime(tmp_path):
    path = tmp_path / "dropout.onnx"
    onnx.save(_dropout_model(), path)
    check_against_onnxruntime(path, tmp_path)
