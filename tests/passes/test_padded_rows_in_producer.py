"""PaddedRowsInProducer on a module whose ``main`` doubles a 6 x 8 input, pads its 6 rows to
two blocks of 4 (the pad kernel PrepackWeights emits, marked PAD_ROWS), and triples the padded
blocks; the same doubling kernel also runs on the input a second time, unpadded.

After: the padded blocks are a reshape of the doubling kernel's output written as 8 rows, rows
6 and 7 zero (``double_padded``: the kernel with a longer row axis and a loop nest of zeros);
the pad kernel is gone; the unpadded call keeps ``double``. Numbers: equal to the original's.
Left alone: a producer something else reads too, and a pad kernel without the mark. End to
end: a bf16 MLP over 47 tokens (its matmuls pad their rows) compiled, loaded in a fresh
process and checked against onnxruntime, with no pad kernel of its own left."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from relax_helpers import assert_matches, kernel_into, run_main_outputs
from tvm import relax, te
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import aotc
from aotc.compiler import symbolic_padding
from aotc.compiler.passes.lowering import PaddedRowsInProducer
from aotc.targets import x86

RNG = np.random.default_rng(0)


def _double(x):
    return te.compute(x.shape, lambda *i: x(*i) * 2.0, name="double")


def _triple(x):
    return te.compute(x.shape, lambda *i: x(*i) * 3.0, name="triple")


def _module(marked: bool = True, producer_read_twice: bool = False) -> tvm.IRModule:
    attrs = {symbolic_padding.PAD_ROWS: 1} if marked else {}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_te(_double, x, primfunc_name_hint="double")
            z = bb.emit_te(symbolic_padding.pad_axis_to_blocks, y, 1, 4,
                           primfunc_name_hint="pad_rows", primfunc_attrs=attrs)
            w = bb.emit_te(_triple, z, primfunc_name_hint="triple")
            other = y if producer_read_twice else bb.emit_te(_double, x,
                                                             primfunc_name_hint="double")
            out = bb.emit_output(relax.Tuple([w, other]))
        bb.emit_func_output(out)
    return bb.get()


@I.ir_module
class Expected:
    @T.prim_func(private=True, s_tir=True)
    def double(x: T.Buffer((T.int64(1), T.int64(6), T.int64(8)), "float32"),
               double: T.Buffer((T.int64(1), T.int64(6), T.int64(8)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1, i2 in T.grid(T.int64(1), T.int64(6), T.int64(8)):
            with T.sblock("double"):
                v_i0, v_i1, v_i2 = T.axis.remap("SSS", [i0, i1, i2])
                T.reads(x[v_i0, v_i1, v_i2])
                T.writes(double[v_i0, v_i1, v_i2])
                double[v_i0, v_i1, v_i2] = x[v_i0, v_i1, v_i2] * T.float32(2.0)

    @T.prim_func(private=True, s_tir=True)
    def double_padded(x: T.Buffer((T.int64(1), T.int64(6), T.int64(8)), "float32"),
                      double: T.Buffer((T.int64(1), T.int64(8), T.int64(8)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1, i2 in T.grid(T.int64(1), T.int64(6), T.int64(8)):
            with T.sblock("double"):
                v_i0, v_i1, v_i2 = T.axis.remap("SSS", [i0, i1, i2])
                T.reads(x[v_i0, v_i1, v_i2])
                T.writes(double[v_i0, v_i1, v_i2])
                double[v_i0, v_i1, v_i2] = x[v_i0, v_i1, v_i2] * T.float32(2.0)
        for z0, z1, z2 in T.grid(T.int64(1), T.int64(2), T.int64(8)):
            with T.sblock("padded_rows_zero"):
                v_z0, v_z1, v_z2 = T.axis.remap("SSS", [z0, z1, z2])
                T.reads()
                T.writes(double[v_z0, v_z1 + T.int64(6), v_z2])
                double[v_z0, v_z1 + T.int64(6), v_z2] = T.float32(0.0)

    @T.prim_func(private=True, s_tir=True)
    def triple(lv1: T.Buffer((T.int64(1), T.int64(2), T.int64(4), T.int64(8)), "float32"),
               triple: T.Buffer((T.int64(1), T.int64(2), T.int64(4), T.int64(8)), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i0, i1, i2, i3 in T.grid(T.int64(1), T.int64(2), T.int64(4), T.int64(8)):
            with T.sblock("triple"):
                v_i0, v_i1, v_i2, v_i3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
                T.reads(lv1[v_i0, v_i1, v_i2, v_i3])
                T.writes(triple[v_i0, v_i1, v_i2, v_i3])
                triple[v_i0, v_i1, v_i2, v_i3] = lv1[v_i0, v_i1, v_i2, v_i3] * T.float32(3.0)

    @R.function
    def main(x: R.Tensor((1, 6, 8), dtype="float32")
             ) -> R.Tuple(R.Tensor((1, 2, 4, 8), dtype="float32"),
                          R.Tensor((1, 6, 8), dtype="float32")):
        cls = Expected
        with R.dataflow():
            lv = R.call_tir(cls.double_padded, (x,), out_ty=R.Tensor((1, 8, 8), dtype="float32"))
            lv1: R.Tensor((1, 2, 4, 8), dtype="float32") = R.reshape(lv, R.shape([1, 2, 4, 8]))
            lv2 = R.call_tir(cls.triple, (lv1,), out_ty=R.Tensor((1, 2, 4, 8), dtype="float32"))
            lv3 = R.call_tir(cls.double, (x,), out_ty=R.Tensor((1, 6, 8), dtype="float32"))
            gv: R.Tuple(R.Tensor((1, 2, 4, 8), dtype="float32"),
                        R.Tensor((1, 6, 8), dtype="float32")) = lv2, lv3
            R.output(gv)
        return gv


def test_the_producer_writes_the_padded_rows():
    before = _module()
    assert "pad_rows" in [gv.name_hint for gv in before.get_global_vars()]
    tvm.ir.assert_structural_equal(PaddedRowsInProducer()(before), Expected)


def test_numbers_match_the_original():
    x = RNG.standard_normal((1, 6, 8)).astype(np.float32) + 10.0
    before = _module()
    after = PaddedRowsInProducer()(before)
    want = run_main_outputs(before, x)
    assert want[0][0, 1, 2:].max() == 0.0  # rows 6 and 7: padding
    for got, w in zip(run_main_outputs(after, x), want):
        np.testing.assert_array_equal(got, w)
    # the kernel alone, into a buffer that holds NaN first: it writes the zeros itself
    got = kernel_into(after, "double_padded", x, np.full((1, 8, 8), np.nan, np.float32))
    np.testing.assert_array_equal(got, np.concatenate(
        [2 * x, np.zeros((1, 2, 8), np.float32)], axis=1))


@pytest.mark.parametrize("module", [_module(producer_read_twice=True), _module(marked=False)],
                         ids=["producer-read-twice", "unmarked-pad"])
def test_left_alone(module):
    after = PaddedRowsInProducer()(module)
    tvm.ir.assert_structural_equal(after, module)


def _mlp_model(path):
    """LayerNorm over 47 tokens of 64, a 64 -> 128 matmul with bias and ReLU, a 128 -> 48
    matmul."""
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w0"], ["h"]),
             helper.make_node("Add", ["h", "b0"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w1"], ["y"])]
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in {
        "g": 1 + 0.1 * RNG.standard_normal(64), "b": 0.1 * RNG.standard_normal(64),
        "w0": RNG.standard_normal((64, 128)) / 8, "b0": 0.1 * RNG.standard_normal(128),
        "w1": RNG.standard_normal((128, 48)) / 11}.items()]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 47, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 47, 48])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.skipif(not x86._BF16_FLAGS <= x86.cpu_flags(),
                    reason="this CPU has no AVX512-BF16 to run the model on")
def test_bf16_mlp_over_47_tokens_against_onnxruntime(tmp_path):
    model = _mlp_model(tmp_path / "mlp.onnx")
    out = tmp_path / "mlp_bf16.so"
    aotc.compile(model, output=out, precision="bf16")
    loaded = aotc.load(out)
    names = [k["name"] for k in loaded.metadata["kernels"]]
    assert not [n for n in names if n.startswith("pad_rows")], names
    assert sum(n.endswith("_padded") for n in names) == 2, names  # the norm and the first matmul
    x = RNG.standard_normal((1, 47, 64)).astype(np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    assert_matches(loaded.run({"x": x})["y"], want, 0.999, 0.02)
