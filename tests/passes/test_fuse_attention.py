"""The fusion group. FuseAttention: softmax(Q @ Kt * scale + mask) @ V becomes one primitive
function (one kernel after FuseTIR); ragged key counts are padded to whole vectors and ragged
query counts to whole row blocks, and the numbers stay the same; chains it must not touch are
left alone. CombineProjections: matmuls sharing an input with constant weights become one."""

import numpy as np
import pytest
import tvm
from relax_helpers import attention_functions, main_ops
from tvm import relax

from aotc.compiler.passes.fusion import CombineProjections, FuseAttention

RNG = np.random.default_rng(0)
TARGET = tvm.target.Target({"kind": "llvm"})


def _attention_module(queries, keys, mask_shape=None, scale="divide", probs_out=False,
                      axis=-1, safe=False):
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((2, 3, queries, 16), "float32"))
    kt = relax.Var("kt", relax.TensorType((2, 3, 16, keys), "float32"))
    v = relax.Var("v", relax.TensorType((2, 3, keys, 8), "float32"))
    params = [q, kt, v]
    mask = None
    if mask_shape is not None:
        mask = relax.Var("mask", relax.TensorType(mask_shape, "float32"))
        params.append(mask)
    with bb.function("main", params):
        with bb.dataflow():
            s = bb.emit(relax.op.matmul(q, kt))
            if scale == "divide":
                s = bb.emit(relax.op.divide(s, relax.const(4.0, "float32")))
            elif scale == "multiply":
                s = bb.emit(relax.op.multiply(relax.const(0.25, "float32"), s))
            if mask is not None:
                s = bb.emit(relax.op.add(s, mask))
            p = bb.emit(relax.op.nn.softmax(s, axis=axis))
            if safe:  # torch's export: where(isnan(p), 0, p)
                p = bb.emit(relax.op.where(bb.emit(relax.op.isnan(p)),
                                           relax.const(0.0, "float32"), p))
            o = bb.emit(relax.op.matmul(p, v))
            out = bb.emit_output(relax.Tuple([o, p]) if probs_out else o)
        bb.emit_func_output(out)
    return bb.get()


def _inputs(mod):
    arrays = []
    for index, param in enumerate(mod["main"].params):
        shape = [int(d) for d in param.ty.shape.values]
        if index == 3:  # the mask: -inf for some keys
            arrays.append(np.where(RNG.random(shape) < 0.3, -np.inf, 0).astype(np.float32))
            arrays[-1][..., 0] = 0  # every row keeps one key
        else:
            arrays.append(RNG.standard_normal(shape).astype(np.float32))
    return arrays


def _run(mod, arrays):
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return out.numpy()



@pytest.mark.parametrize("queries, keys, mask_shape, scale", [
    (197, 197, (1, 1, 197, 197), "divide"),   # ragged: padded rows and keys, full mask
    (128, 128, None, "multiply"),             # whole vectors: nothing to pad
    (13, 29, (29,), None),                    # mask broadcast over rows, no scale
])
def test_attention_becomes_one_function_with_the_same_numbers(queries, keys, mask_shape, scale):
    before = _attention_module(queries, keys, mask_shape, scale)
    after = FuseAttention()(before)
    assert len(attention_functions(after)) == 1
    ops = main_ops(after)
    assert "relax.nn.softmax" not in ops and "relax.matmul" not in ops
    padded = keys % 16 != 0 or queries % 8 != 0
    assert ("relax.nn.pad" in ops) == padded
    assert ("relax.strided_slice" in ops) == (queries % 8 != 0)
    arrays = _inputs(before)
    np.testing.assert_allclose(_run(after, arrays), _run(before, arrays),
                               rtol=1e-5, atol=1e-6)


def _symbolic_attention_module():
    """Attention over a symbolic batch and sequence (a model exported with dynamic axes),
    with an additive mask per key."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((batch, 3, seq, 16), "float32"))
    kt = relax.Var("kt", relax.TensorType((batch, 3, 16, seq), "float32"))
    v = relax.Var("v", relax.TensorType((batch, 3, seq, 8), "float32"))
    mask = relax.Var("mask", relax.TensorType((batch, 1, 1, seq), "float32"))
    with bb.function("main", [q, kt, v, mask]):
        with bb.dataflow():
            s = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, kt)),
                                          relax.const(0.25, "float32")))
            p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(s, mask)), axis=-1))
            out = bb.emit_output(relax.op.matmul(p, v))
        bb.emit_func_output(out)
    return bb.get()


def test_a_symbolic_length_is_padded_by_kernels_and_fused():
    """The padded extents are (seq + 15) // 16 * 16 keys and (seq + 7) // 8 * 8 rows, which
    the Attention rule can split into whole vectors and row blocks; before, a symbolic
    length left attention as three kernels (8x the time of a fixed-length build)."""
    before = _symbolic_attention_module()
    after = FuseAttention()(before)
    assert len(attention_functions(after)) == 1
    ops = main_ops(after)
    assert "relax.nn.softmax" not in ops and "relax.matmul" not in ops
    pads = sorted(gv.name_hint for gv, f in after.functions_items()
                  if gv.name_hint.startswith("aotc_pad"))
    # rows of Q (zeros), keys of Kt and V (zeros), the mask's keys (the lowest float)
    assert len(pads) == 4 and sum(name.endswith("_lowest") for name in pads) == 1
    fused = after[attention_functions(after)[0]]
    keys = str(fused.params[1].ty.shape.values[-1])
    assert keys == "(seq + T.int64(15)) // T.int64(16) * T.int64(16)", keys
    for batch, seq in [(1, 1), (2, 13), (1, 16), (3, 37)]:
        arrays = [RNG.standard_normal(shape).astype(np.float32) for shape in
                  [(batch, 3, seq, 16), (batch, 3, 16, seq), (batch, 3, seq, 8)]]
        mask = np.where(RNG.random((batch, 1, 1, seq)) < 0.3, -1e9, 0).astype(np.float32)
        mask[..., 0] = 0
        np.testing.assert_allclose(_run(after, arrays + [mask]), _run(before, arrays + [mask]),
                                   rtol=1e-5, atol=1e-6, err_msg=f"{batch}x{seq}")


@pytest.mark.parametrize("queries, keys", [(128, 128), (197, 197)])
def test_torchs_safe_softmax_is_fused_too(queries, keys):
    """softmax then where(isnan(p), 0, p), as torch exports it (BERT from transformers): one
    function with the where inside; before, the chain stayed three kernels."""
    before = _attention_module(queries, keys, (1, 1, 1, keys), "divide", safe=True)
    after = FuseAttention()(before)
    assert len(attention_functions(after)) == 1
    ops = main_ops(after)
    assert "relax.where" not in ops and "relax.isnan" not in ops
    fused = [f for gv, f in after.functions_items() if gv.name_hint in
             attention_functions(after)][0]
    inner = []
    relax.analysis.post_order_visit(fused.body, lambda e: inner.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    assert "relax.isnan" in inner and "relax.where" in inner
    arrays = _inputs(before)
    np.testing.assert_allclose(_run(after, arrays), _run(before, arrays), rtol=1e-5, atol=1e-6)


def test_a_scalar_mask_with_padded_keys_is_fused():
    """A rank-0 mask (ONNX's flexattention score_mod adds one value to every score): the
    padded keys get their own mask beside it. The padding indexed the mask's last dim and
    failed the compile."""
    before = _attention_module(13, 29, mask_shape=())
    after = FuseAttention()(before)
    assert len(attention_functions(after)) == 1
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype(np.float32)
              for p in before["main"].params]
    np.testing.assert_allclose(_run(after, arrays), _run(before, arrays), rtol=1e-5, atol=1e-6)


def test_probabilities_read_elsewhere_are_not_fused():
    before = _attention_module(197, 197, scale="divide", probs_out=True)
    after = FuseAttention()(before)
    assert attention_functions(after) == []
    assert "relax.nn.pad" not in main_ops(after)  # no second, padded copy of the chain


def test_softmax_over_another_axis_is_not_attention():
    after = FuseAttention()(_attention_module(16, 16, axis=2))
    assert attention_functions(after) == []


def _parallel_projections(constant_weights=True, biases=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((7, 32), "float32"))
    params = [x]
    if constant_weights:
        weights = [relax.const(RNG.standard_normal((32, n)).astype(np.float32))
                   for n in (48, 48, 16)]
    else:
        weights = [relax.Var(f"w{i}", relax.TensorType((32, n), "float32"))
                   for i, n in enumerate((48, 48, 16))]
        params += weights

    def project(i):
        y = relax.op.matmul(x, weights[i])
        if biases:
            y = relax.op.add(bb.emit(y), relax.const(RNG.standard_normal(
                int(weights[i].ty.shape.values[1])).astype(np.float32)))
        return bb.emit(y)
    with bb.function("main", params):
        with bb.dataflow():
            gate = bb.emit(relax.op.nn.silu(project(0)))
            up, side = project(1), project(2)
            out = bb.emit_output(relax.op.concat([relax.op.multiply(gate, up), side], axis=1))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("biases", [False, True])
def test_projections_sharing_an_input_become_one_matmul(biases):
    before = _parallel_projections(biases=biases)
    after = CombineProjections()(before)
    assert main_ops(before).count("relax.matmul") == 3
    assert main_ops(after).count("relax.matmul") == 1
    assert main_ops(after).count("relax.strided_slice") == 3
    assert main_ops(after).count("relax.add") == (1 if biases else 0)
    x = RNG.standard_normal((7, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(after, [x]), _run(before, [x]), rtol=1e-5, atol=1e-5)


def _bert_projections(combined: bool = False):
    """A BERT export's Q, K and V: each ``bias + layer_norm(x) @ W`` (bias on the left, the
    input computed in the block). With ``combined``, what CombineProjections should make of
    it, written out: one matmul of the concatenated weights, one add of the concatenated
    biases, three slices."""
    rng = np.random.default_rng(1)
    weights = [rng.standard_normal((32, 32)).astype(np.float32) for _ in range(3)]
    biases = [rng.standard_normal(32).astype(np.float32) for _ in range(3)]
    gamma, beta = np.ones(32, np.float32), np.zeros(32, np.float32)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 7, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), [-1]))
            if combined:
                both = bb.emit(relax.op.matmul(h, relax.const(np.concatenate(weights, 1))))
                both = bb.emit(relax.op.add(both, relax.const(np.concatenate(biases))))
                parts = [bb.emit(relax.op.strided_slice(both, axes=[2], begin=[32 * i],
                                                        end=[32 * (i + 1)])) for i in range(3)]
            else:
                parts = [bb.emit(relax.op.add(relax.const(b), bb.emit(
                    relax.op.matmul(h, relax.const(w))))) for w, b in zip(weights, biases)]
            out = bb.emit_output(relax.op.concat(parts, axis=2))
        bb.emit_func_output(out)
    return bb.get()


def test_projections_of_a_computed_input_with_left_biases_become_one_matmul():
    """The form BERT exports have (the one that matters): before, three matmuls; after, the
    expected module; the same numbers."""
    before = _bert_projections()
    after = CombineProjections()(before)
    tvm.ir.assert_structural_equal(after, _bert_projections(combined=True))
    x = RNG.standard_normal((1, 7, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(after, [x]), _run(before, [x]), rtol=1e-5, atol=1e-5)


def test_run_time_weights_are_not_concatenated():
    after = CombineProjections()(_parallel_projections(constant_weights=False))
    assert main_ops(after).count("relax.matmul") == 3


def test_a_member_whose_product_is_read_twice_keeps_its_add_and_shares_the_matmul():
    """Three biased projections of one input, the first product also read on its own: its
    bias add stays after its slice, the other two take the combined bias, and all three slice
    one combined matmul (two would read the input twice again)."""
    weights = [RNG.standard_normal((32, 16)).astype(np.float32) for _ in range(3)]
    biases = [RNG.standard_normal(16).astype(np.float32) for _ in range(3)]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((7, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            products = [bb.emit(relax.op.matmul(x, relax.const(w))) for w in weights]
            parts = [bb.emit(relax.op.add(p, relax.const(b))) for p, b in zip(products, biases)]
            out = bb.emit_output(relax.op.concat([*parts, products[0]], axis=1))
        bb.emit_func_output(out)
    before = bb.get()
    after = CombineProjections()(before)
    ops = main_ops(after)
    assert ops.count("relax.matmul") == 1 and ops.count("relax.strided_slice") == 3
    assert ops.count("relax.add") == 2  # the combined bias, and the first member's own
    xs = RNG.standard_normal((7, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(after, [xs]), _run(before, [xs]), rtol=1e-5, atol=1e-5)
