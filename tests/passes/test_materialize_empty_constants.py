"""MaterializeEmptyConstants: zero-size constants (TVM writes them into the .so in a form its
loader rejects: "Invalid DLTensor file format") become kernel outputs; models with empty
constants and empty inputs load and match onnxruntime."""

import numpy as np
import onnx
import tvm
from helpers import check_against_onnxruntime, compile_and_load
from onnx import TensorProto, helper
from tvm import relax

from aotc.compiler.passes import MaterializeEmptyConstants


def test_empty_constants_become_kernel_outputs():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            empty = relax.const(np.zeros((2, 0), np.float32))
            out = bb.emit_output(relax.op.concat([x, empty], axis=1))
        bb.emit_func_output(out)
    after = MaterializeEmptyConstants()(bb.get())
    assert "aotc_empty_tensor" in [gv.name_hint for gv in after.get_global_vars()]
    shapes = []
    relax.analysis.post_order_visit(after["main"], lambda e: shapes.append(
        tuple(e.value.shape)) if isinstance(e, tvm.ir.GenericConst) else None)
    assert not [s for s in shapes if 0 in s]


def test_model_with_an_empty_constant_loads_and_matches(tmp_path):
    empty = onnx.numpy_helper.from_array(np.zeros((2, 0), np.float32), "empty")
    graph = helper.make_graph(
        [helper.make_node("Concat", ["x", "empty"], ["y"], axis=1)], "concat_empty",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=[empty])
    path = tmp_path / "concat_empty.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    check_against_onnxruntime(path, tmp_path)


def test_empty_inputs_run(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu_empty",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 0, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = compile_and_load(model, tmp_path, input_shapes={"x": (2, 0, 4)})
    assert compiled.run({"x": np.zeros((2, 0, 4), np.float32)})["y"].shape == (2, 0, 4)
