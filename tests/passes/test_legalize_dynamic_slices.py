"""LegalizeDynamicSlices: dynamic_strided_slice becomes call_tir of kernels the module defines,
so FoldConstant can no longer leave a call to an undefined shape function; ONNX Slice with
run-time starts (which failed in FuseOps) compiles and matches onnxruntime."""

import numpy as np
import onnx
import tvm
from helpers import check_against_onnxruntime
from onnx import TensorProto, helper
from relax_helpers import main_ops
from tvm import relax

from aotc.compiler.passes import LegalizeDynamicSlices


def _slice_module() -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6), "float32"))
    end = relax.Var("end", relax.TensorType((2,), "int64"))
    with bb.function("main", [x, end]):
        with bb.dataflow():
            begin = relax.const(np.zeros(2, np.int64), "int64")
            ones = relax.const(np.ones(2, np.int64), "int64")
            out = bb.emit_output(relax.op.dynamic_strided_slice(x, begin, end, ones))
        bb.emit_func_output(out)
    return bb.get()


def test_slices_are_lowered_to_defined_kernels():
    before = _slice_module()
    assert main_ops(before) == ["relax.dynamic_strided_slice"]
    after = LegalizeDynamicSlices()(before)
    # expected: the op's own legalization (the only op here, so LegalizeOps gives just that),
    # with its shape function and slice kernel defined in the module
    tvm.ir.assert_structural_equal(after, relax.transform.LegalizeOps()(_slice_module()))
    assert main_ops(after) == ["relax.call_tir", "relax.tensor_to_shape", "relax.call_tir"]
    assert sorted(gv.name_hint for gv in after.get_global_vars()) == [
        "dynamic_strided_slice", "main", "shape_func"]
    with tvm.target.Target({"kind": "llvm"}):
        folded = relax.transform.FoldConstant()(after)
    fused = relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(folded))
    vm = relax.VirtualMachine(tvm.compile(fused, target="llvm"), tvm.cpu())
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array([3, 4]))).numpy()
    np.testing.assert_array_equal(got, x[:3, :4])


def test_onnx_slice_with_runtime_starts_matches_onnxruntime(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends"], ["y"])], "slice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]),
         helper.make_tensor_value_info("starts", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(np.array([4, 5], np.int64), "ends")])
    path = tmp_path / "slice.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    for starts in ([1, 2], [0, -3]):
        check_against_onnxruntime(path, tmp_path, feed={"x": x, "starts": np.array(starts)})
