"""FoldConstantsNumpy: constant chains become constants with the values TVM's FoldConstant
computes; integer division and non-constant calls stay."""

import numpy as np
import tvm
from tvm import relax

from aotc.compiler.explain import op_counts
from aotc.compiler.passes import FoldConstantsNumpy

RNG = np.random.default_rng(0)
SCALE = RNG.uniform(0.5, 1.5, (8,)).astype(np.float32)
SHIFT = RNG.standard_normal((8,)).astype(np.float32)
WEIGHT = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)


def _module():
    """BatchNorm-style constant arithmetic feeding a conv, plus a run-time add and an
    integer division of constants."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 3, 6, 6], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            std = bb.emit(relax.op.sqrt(relax.op.add(relax.const(SCALE), relax.const(1e-5))))
            inv = bb.emit(relax.op.divide(relax.const(SHIFT), std))
            col = bb.emit(relax.op.expand_dims(inv, [1, 2, 3]))
            w = bb.emit(relax.op.multiply(relax.const(WEIGHT), col))
            w_hwio = bb.emit(relax.op.permute_dims(w, [2, 3, 1, 0]))
            w_back = bb.emit(relax.op.permute_dims(w_hwio, [3, 2, 0, 1]))
            y = bb.emit(relax.op.nn.conv2d(x, w_back, padding=[1, 1, 1, 1]))
            scalar = bb.emit(relax.op.add(relax.const(np.float32(2)), relax.const(np.float32(3))))
            y = bb.emit(relax.op.multiply(y, scalar))  # 0-d constants stay 0-d
            int_div = bb.emit(relax.op.divide(relax.const(np.array([7, -7], "int32")),
                                              relax.const(np.array([2, 2], "int32"))))
            out = bb.emit_output(relax.Tuple([relax.op.add(y, y), int_div]))
        bb.emit_func_output(out)
    return bb.get()


def test_constant_chain_is_folded_and_the_rest_kept():
    before = _module()
    after = FoldConstantsNumpy()(before)
    ops = op_counts(relax.transform.DeadCodeElimination()(after))
    assert ops["sqrt"] == ops["expand_dims"] == ops["permute_dims"] == 0
    assert ops["nn.conv2d"] == ops["add"] == ops["multiply"] == 1  # run-time ones stay
    scalars = [b.value for b in after["main"].body.blocks[0].bindings
               if isinstance(b.value, tvm.ir.GenericConst) and b.value.value.numpy().ndim == 0]
    assert scalars and float(scalars[0].value.numpy()) == 5.0
    assert ops["divide"] == 1  # integer division is TVM's to fold


def test_values_match_tvm_fold_constant_and_numerics():
    before = _module()
    ours = relax.transform.FoldConstant()(FoldConstantsNumpy()(before))
    theirs = relax.transform.FoldConstant()(before)
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    results = []
    for mod in (ours, theirs, before):
        exe = tvm.compile(mod, target="llvm")
        vm = relax.VirtualMachine(exe, tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x))
        results.append([out[0].numpy(), out[1].numpy()])
    np.testing.assert_array_equal(results[0][0], results[1][0])  # bit-identical folding
    np.testing.assert_allclose(results[0][0], results[2][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(results[0][1], results[1][1])


def _gather_a_dim(index: int, out_of_range_too: bool = False):
    """ONNX's Shape -> Gather with a negative index made positive (less/add/where), the dim
    then scaling the input; optionally a gather past the end, which must stay."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 3, 5], "float32"))
    i64 = lambda v: relax.const(np.array(v, "int64"), "int64")  # noqa: E731
    with bb.function("main", [x]):
        with bb.dataflow():
            dims = bb.emit(relax.op.shape_to_tensor(bb.emit(relax.op.shape_of(x))))
            negative = bb.emit(relax.op.less(i64(index), i64(0)))
            positive = bb.emit(relax.op.where(negative, bb.emit(relax.op.add(i64(index), i64(3))),
                                              i64(index)))
            dim = bb.emit(relax.op.take(dims, positive, axis=0))
            if out_of_range_too:
                dim = bb.emit(relax.op.add(dim, bb.emit(relax.op.take(dims, i64(3), axis=0))))
            scale = bb.emit(relax.op.astype(dim, "float32"))
            out = bb.emit_output(relax.op.multiply(x, scale))
        bb.emit_func_output(out)
    return bb.get()


def _scaled_by(value: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 3, 5], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            dim = bb.emit(relax.const(np.array(value, "int64"), "int64"))
            scale = bb.emit(relax.op.astype(dim, "float32"))
            out = bb.emit_output(relax.op.multiply(x, scale))
        bb.emit_func_output(out)
    return bb.get()


def test_a_dim_gathered_from_a_static_shape_becomes_a_constant():
    before = _gather_a_dim(-1)
    after = relax.transform.DeadCodeElimination()(FoldConstantsNumpy()(before))
    tvm.ir.assert_structural_equal(after, _scaled_by(5))  # casts stay TVM's to fold
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    outputs = []
    for mod in (before, after):
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        outputs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[1], x * 5)


def test_a_gather_past_the_end_is_left_to_tvm():
    after = FoldConstantsNumpy()(_gather_a_dim(1, out_of_range_too=True))
    assert op_counts(relax.transform.DeadCodeElimination()(after))["take"] == 1
