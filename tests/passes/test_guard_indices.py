"""GuardIndices: constant indices are normalized at compile time, other indices go through a
range-checking kernel; compiled models match torch / onnxruntime in range and raise a named
error out of range (plain TVM read out of bounds in both cases)."""

import subprocess

import numpy as np
import onnx
import pytest
import torch
import tvm
from helpers import (
    check_against_onnxruntime,
    check_against_torch,
    compile_and_load,
    run_in_fresh_process,
)
from onnx import TensorProto, helper
from tvm import relax
from tvm.script import relax as R

import aotc
from aotc.compiler.passes import GuardIndices
from aotc.errors import CompileError, ModelRunError


def _ops(mod: tvm.IRModule) -> list[str]:
    """Names of the ops and call_tir'd functions of main, in order."""
    names = []
    for binding in mod["main"].body.blocks[0].bindings:
        call = binding.value
        if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
            names.append(call.op.name if call.op.name != "relax.call_tir"
                         else call.args[0].name_hint)
    return names


def test_dynamic_indices_go_through_a_checking_kernel():
    @R.function
    def main(x: R.Tensor((4, 5), "float32"), i: R.Tensor((3,), "int64")):
        with R.dataflow():
            y = R.take(x, i, axis=1)
            R.output(y)
        return y

    after = GuardIndices()(tvm.IRModule({"main": main}))
    assert _ops(after) == ["aotc_guard_take_indices", "relax.take"]
    guard = after["aotc_guard_take_indices"]
    assert isinstance(guard, tvm.tirx.PrimFunc) and guard.attrs["tirx.is_scheduled"]
    take = after["main"].body.blocks[0].bindings[1].value
    assert take.args[1].same_as(after["main"].body.blocks[0].bindings[0].var)


def test_the_importers_negative_wrap_is_replaced_by_the_guard():
    """TVM's ONNX importer wraps i < 0 to i + n before the take; the guard wraps too, so the
    importer's wrap is dropped and the guard reads the indices as given."""
    @R.function
    def before(x: R.Tensor((4, 3), "float32"), i: R.Tensor((2,), "int64")):
        with R.dataflow():
            negative = R.less(i, R.const(0, "int64"))
            wrapped = R.add(i, R.const(4, "int64"))
            fixed = R.where(negative, wrapped, i)  # noqa: F841  (the pass leaves it)
            y = R.take(x, fixed, axis=0)
            R.output(y)
        return y

    guarded = GuardIndices()(tvm.IRModule({"main": before}))
    guard = guarded.get_global_var("aotc_guard_take_indices")

    @R.function
    def expected(x: R.Tensor((4, 3), "float32"), i: R.Tensor((2,), "int64")):
        with R.dataflow():
            negative = R.less(i, R.const(0, "int64"))
            wrapped = R.add(i, R.const(4, "int64"))
            fixed = R.where(negative, wrapped, i)  # noqa: F841
            checked = R.call_tir(guard, (i, x), out_ty=R.Tensor((2,), "int64"))
            y = R.take(x, checked, axis=0, mode="clip")
            R.output(y)
        return y

    tvm.ir.assert_structural_equal(guarded["main"].without_attr("global_symbol"),
                                   expected.without_attr("global_symbol"))


def test_a_wrap_by_another_extent_is_kept():
    """where(i < 0, i + 3, i) on a 4-row take is the model's own arithmetic, not the importer's
    wrap: it stays, and the guard checks its result."""
    @R.function
    def main(x: R.Tensor((4, 3), "float32"), i: R.Tensor((2,), "int64")):
        with R.dataflow():
            fixed = R.where(R.less(i, R.const(0, "int64")), R.add(i, R.const(3, "int64")), i)
            y = R.take(x, fixed, axis=0)
            R.output(y)
        return y

    after = GuardIndices()(tvm.IRModule({"main": main}))
    bindings = after["main"].body.blocks[0].bindings
    guard_call = next(b.value for b in bindings if isinstance(b.value, relax.Call)
                      and b.value.op.name == "relax.call_tir")
    where_var = next(b.var for b in bindings if isinstance(b.value, relax.Call)
                     and b.value.op.name == "relax.where")
    assert guard_call.args[1][0].same_as(where_var)


def test_negative_constant_index_is_normalized_at_compile_time():
    @R.function
    def main(x: R.Tensor((3, 5), "float32")):
        with R.dataflow():
            y = R.take(x, R.const(-1, "int64"), axis=1)
            R.output(y)
        return y

    after = GuardIndices()(tvm.IRModule({"main": main}))
    assert _ops(after) == ["relax.take"]
    index = after["main"].body.blocks[0].bindings[0].value.args[1]
    assert int(index.value.numpy()) == 4


def test_out_of_range_constant_index_is_a_compile_error(tmp_path):
    node = helper.make_node("Gather", ["data", "idx"], ["y"], axis=1)
    graph = helper.make_graph(
        [node], "gather", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [helper.make_tensor("idx", TensorProto.INT64, [], [7])])
    path = tmp_path / "gather7.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(CompileError, match="take: constant index 7 is out of range .* size 5"):
        compile_and_load(path, tmp_path)


class LastStep(torch.nn.Module):
    def forward(self, x):
        return x[:, -1] * 2


class Lookups(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(4, 3)

    def forward(self, ids, x):
        return self.emb(ids), torch.index_select(x, 1, ids[0]), x.gather(1, ids)


def test_torch_negative_select_matches_torch(tmp_path):
    """Plain TVM read the element before the tensor here (max diff 1.9e11)."""
    check_against_torch(LastStep(), (torch.randn(3, 5),), tmp_path)


def test_torch_lookups_match_in_range_and_raise_out_of_range(tmp_path):
    torch.manual_seed(0)
    ids, x = torch.tensor([[0, 3]]), torch.randn(1, 5)
    model = check_against_torch(Lookups(), (ids, x), tmp_path)
    for bad in (4, 10**8, -5):
        with pytest.raises(ModelRunError, match="IndexError: take: an index is out of range"):
            model(np.array([[0, bad]]), x.numpy())


def _gather_model(op: str, data_shape, index_shape, out_shape, **attrs):
    nodes = [helper.make_node(op, ["data", "idx"], ["y"], **attrs)]
    graph = helper.make_graph(
        nodes, op.lower(),
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, data_shape),
         helper.make_tensor_value_info("idx", TensorProto.INT64, index_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES = {
    "Gather": (dict(axis=0), [6, 4], [3], [3, 4], [[0, -1, 5]], 6),
    "GatherElements": (dict(axis=1), [3, 4], [3, 2], [3, 2], [[0, -1], [3, 2], [-4, 1]], 4),
    "GatherND": (dict(), [3, 4], [2, 2], [2], [[2, -1], [-3, 3]], 4),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_onnx_gathers_match_in_range_and_raise_out_of_range(op, tmp_path):
    attrs, dshape, ishape, oshape, good, too_big = CASES[op]
    path = tmp_path / f"{op}.onnx"
    onnx.save(_gather_model(op, dshape, ishape, oshape, **attrs), path)
    data = np.random.default_rng(0).standard_normal(dshape).astype(np.float32)
    feed = {"data": data, "idx": np.array(good, np.int64).reshape(ishape)}
    model, _ = check_against_onnxruntime(path, tmp_path, feed=feed)
    bad = feed["idx"].copy()
    bad.flat[-1] = too_big
    with pytest.raises(ModelRunError, match="IndexError"):
        model.run({"data": data, "idx": bad})


def test_scatter_elements_out_of_range_raises(tmp_path):
    node = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=0)
    graph = helper.make_graph(
        [node], "scatter",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [4, 2]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 2]),
         helper.make_tensor_value_info("upd", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])])
    path = tmp_path / "scatter.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    feed = {"data": np.zeros((4, 2), np.float32), "idx": np.array([[-1, 2]]),
            "upd": np.ones((1, 2), np.float32)}
    model, _ = check_against_onnxruntime(path, tmp_path, feed=feed)
    with pytest.raises(ModelRunError, match="IndexError"):
        model.run({**feed, "idx": np.array([[0, 4]])})


@pytest.mark.parametrize("op", sorted(CASES))
def test_indices_below_minus_n_raise_instead_of_wrapping_twice(op, tmp_path):
    """-n-1 and -2n were wrapped by the importer and then by the guard (Gather -5 on 4 rows
    read row 3); ONNX and torch reject them. Run in a fresh process, as users run."""
    attrs, dshape, ishape, oshape, good, too_big = CASES[op]
    path = tmp_path / f"{op}.onnx"
    onnx.save(_gather_model(op, dshape, ishape, oshape, **attrs), path)
    out = tmp_path / f"{op}.so"
    aotc.compile(path, output=out)
    data = np.random.default_rng(0).standard_normal(dshape).astype(np.float32)
    for index in (-too_big - 1, -2 * too_big):
        bad = np.array(good, np.int64).reshape(ishape)
        bad.flat[-1] = index
        with pytest.raises(subprocess.CalledProcessError) as err:
            run_in_fresh_process(out, {"data": data, "idx": bad}, tmp_path,
                                 capture=True)
        assert "IndexError" in err.value.stderr.decode()
