"""Sort, argsort, top-k and NonZero run where only TVM's runtime is loaded (as a user's
process): TOPI's CPU sort kernels called ``tvm.contrib.sort.*`` from TVM's compiler library and
NonZero ran as a numpy function of TVM's Python package, so such models compiled, ran in the
compiling process and failed in every other. Compiled models here run in a separate process
that never loaded the compiler (tests/fresh_runner.py). Unique, which has no aotc kernel yet,
is refused when compiled instead of failing later."""

import numpy as np
import onnx
import pytest
import torch
import tvm
from helpers import check_against_onnxruntime, check_against_torch
from onnx import TensorProto, helper, numpy_helper
from relax_helpers import main_ops
from tvm import relax, te, topi
from tvm.relax import op as R

import aotc
from aotc.compiler.default_schedules import sort_kernels
from aotc.compiler.passes.lowering import SelfContainedKernels
from aotc.compiler.runtime_deps import check_runtime_only
from aotc.errors import CompileError, UnsupportedModelError


def _topk_model(length: int, k: int) -> onnx.ModelProto:
    nodes = [helper.make_node("TopK", ["x", "k"], ["top_values", "top_indices"], axis=1),
             helper.make_node("TopK", ["x", "k"], ["low_values", "low_indices"], axis=0,
                              largest=0)]
    outputs = [helper.make_tensor_value_info(n, t, None) for n, t in [
        ("top_values", TensorProto.FLOAT), ("top_indices", TensorProto.INT64),
        ("low_values", TensorProto.FLOAT), ("low_indices", TensorProto.INT64)]]
    graph = helper.make_graph(
        nodes, "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, length])],
        outputs, [numpy_helper.from_array(np.array([k], np.int64), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("length, k", [(1031, 7), (6, 5), (1, 1)])
def test_topk_with_ties_matches_onnxruntime_exactly(tmp_path, length, k):
    """Integers 0-19 give many ties: the lower index comes first, as in onnxruntime."""
    onnx.save(_topk_model(length, min(k, 5)), tmp_path / "topk.onnx")
    x = np.random.default_rng(length).integers(0, 20, (5, length)).astype(np.float32)
    check_against_onnxruntime(tmp_path / "topk.onnx", tmp_path, feed={"x": x}, rtol=0, atol=0)


class SortArgsortTopk(torch.nn.Module):
    def forward(self, x):
        ascending = torch.sort(x, dim=-1).values
        order = torch.argsort(x, dim=0, descending=True)  # no ties: distinct floats
        top = torch.topk(x, 3, dim=1)
        return ascending, order, top.values, top.indices


def test_torch_sort_argsort_topk_match_torch(tmp_path):
    x = torch.randn(4, 97)
    check_against_torch(SortArgsortTopk(), (x,), tmp_path, rtol=0, atol=0)


class Medians(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.median(x, dim=1)
        return torch.median(x), values, indices, torch.median(x, dim=0, keepdim=True).values


def test_torch_median_matches_torch(tmp_path):
    """TVM legalized relax.median with TOPI's argsort (tvm.contrib.sort): refused now by the
    runtime check, so it runs on aotc's sort."""
    check_against_torch(Medians(), (torch.randn(5, 8),), tmp_path, rtol=0, atol=0)


def _sort_module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 9], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(R.topk(x, k=3, axis=1, ret_type="both",
                                                largest=True, dtype="int64")))
        bb.emit_func_output(out)
    return bb.get()


def test_sort_ops_become_aotc_kernels():
    before = _sort_module()
    after = SelfContainedKernels()(before)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 9], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(bb.call_te(
                sort_kernels.topk, x, 3, 1, "both", True, "int64",
                primfunc_name_hint="aotc_topk")))
        bb.emit_func_output(out)
    tvm.ir.assert_structural_equal(after, bb.get())
    assert main_ops(before) == ["relax.topk"] and main_ops(after) == ["relax.call_tir"]
    check_runtime_only(after)  # no call into the compiler's library (tvm.contrib.sort)


def test_a_kernel_calling_the_compiler_library_is_refused():
    x = te.placeholder((4, 9), "float32", name="x")
    mod = tvm.IRModule({"topi_sort": te.create_prim_func([x, topi.sort(x)])})
    with pytest.raises(CompileError, match=r"kernel topi_sort calls \['tvm.contrib.sort.sort'\]"):
        check_runtime_only(mod)
    x2 = te.placeholder((4, 9), "float32", name="x")
    ours = tvm.IRModule({"ours": te.create_prim_func([x2, sort_kernels.sort(x2)])})
    check_runtime_only(ours)  # no packed calls: nothing to refuse


def _one_op_model(op: str, out_type: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])], op.lower(),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", out_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("x", [
    np.array([[0, 1, 0, 2, 0], [3, 0, 0, 0, 4], [0, 0, 0, 0, 0]], np.float32),
    np.zeros((3, 5), np.float32),  # no element: a [2, 0] result
    np.ones((3, 5), np.float32)])
def test_nonzero_matches_onnxruntime(tmp_path, x):
    onnx.save(_one_op_model("NonZero", TensorProto.INT64), tmp_path / "nonzero.onnx")
    check_against_onnxruntime(tmp_path / "nonzero.onnx", tmp_path, feed={"x": x}, rtol=0, atol=0)


def test_unique_is_refused_when_compiled(tmp_path):
    onnx.save(_one_op_model("Unique", TensorProto.FLOAT), tmp_path / "unique.onnx")
    with pytest.raises(UnsupportedModelError, match=r"Unique: TVM runs it through "
                       r"\['relax.run.unique'\], which only TVM's compiler package registers"):
        aotc.compile(tmp_path / "unique.onnx", output=tmp_path / "unique.so")
