"""The clean-up group: ElementwiseUnderReshape runs an elementwise chain between a reshape and
its inverse on the unreshaped tensor; SplitIntoSlices turns a split into slices;
CollapseLayoutChains merges reshape chains and composes (or cancels) transpose pairs;
FoldPadIntoConv moves zero padding of H and W into the convolution, leaving other pads alone.
Each checks the IR after the pass and equal numbers before and after."""

import numpy as np
import pytest
import tvm
from relax_helpers import main_ops, one_input_module
from tvm import relax

from aotc.compiler.passes import (
    CollapseLayoutChains,
    ElementwiseUnderReshape,
    FoldPadIntoConv,
    SplitIntoSlices,
)

RNG = np.random.default_rng(0)
TARGET = tvm.target.Target({"kind": "llvm"})


_module = one_input_module



def _same_numbers(before, after, shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    results = []
    for mod in (before, after):
        vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
        results.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-5)


def test_reshape_chain_becomes_one_reshape():
    def build(bb, x):
        y = bb.emit(relax.op.reshape(x, [2, 3, 4, 5]))
        y = bb.emit(relax.op.squeeze(relax.op.expand_dims(y, 0), [0]))
        return relax.op.reshape(y, [6, 20])
    before = _module((120,), build)
    after = CollapseLayoutChains()(before)
    assert main_ops(after).count("relax.reshape") == 1 and "relax.squeeze" not in main_ops(after)
    _same_numbers(before, after, (120,))


def test_transpose_pairs_compose_or_cancel():
    def cancel(bb, x):
        y = bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))
        return relax.op.permute_dims(y, [0, 2, 1, 3])

    def compose(bb, x):
        y = bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))
        return relax.op.permute_dims(y, [0, 1, 3, 2])
    shape = (2, 3, 4, 5)
    cancelled = CollapseLayoutChains()(_module(shape, cancel))
    assert "relax.permute_dims" not in main_ops(cancelled)
    before = _module(shape, compose)
    after = CollapseLayoutChains()(before)
    assert main_ops(after).count("relax.permute_dims") == 1
    _same_numbers(before, after, shape)


def test_a_transpose_with_another_reader_is_kept():
    def build(bb, x):
        y = bb.emit(relax.op.permute_dims(x, [1, 0]))
        z = bb.emit(relax.op.permute_dims(y, [1, 0]))
        return relax.op.add(z, relax.op.sum(y))
    after = CollapseLayoutChains()(_module((3, 4), build))
    assert main_ops(after).count("relax.permute_dims") == 2


def _conv_after_pad(pad_width, pad_value=0.0):
    weight = relax.const(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32))

    def build(bb, x):
        y = bb.emit(relax.op.nn.pad(x, pad_width, pad_value=pad_value))
        return relax.op.nn.conv2d(y, weight, padding=[1, 1, 1, 1])
    return _module((1, 3, 9, 9), build)


def test_zero_padding_of_height_and_width_folds_into_the_conv():
    before = _conv_after_pad([0, 0, 0, 0, 0, 1, 2, 0])  # bottom 1, left 2: asymmetric
    after = FoldPadIntoConv()(before)
    assert "relax.nn.pad" not in main_ops(after)
    convs = []
    relax.analysis.post_order_visit(after["main"], lambda e: convs.append(e) if isinstance(
        e, relax.Call) and getattr(e.op, "name", "") == "relax.nn.conv2d" else None)
    assert [int(p) for p in convs[0].attrs.padding] == [1, 3, 2, 1]
    _same_numbers(before, after, (1, 3, 9, 9))


def test_nonzero_or_channel_padding_stays():
    nonzero = _conv_after_pad([0, 0, 0, 0, 1, 1, 1, 1], pad_value=1.0)
    channels = _module((1, 2, 9, 9), lambda bb, x: relax.op.nn.conv2d(
        bb.emit(relax.op.nn.pad(x, [0, 0, 0, 1, 0, 0, 0, 0])),
        relax.const(np.ones((4, 3, 3, 3), np.float32))))
    for module in (nonzero, channels):
        assert "relax.nn.pad" in main_ops(FoldPadIntoConv()(module))


_W1 = relax.const(RNG.standard_normal((8, 12)).astype(np.float32))
_W2 = relax.const(RNG.standard_normal((12, 8)).astype(np.float32))
_BIAS = relax.const(RNG.standard_normal((12,)).astype(np.float32))


def _mlp(operand=None, reader=None, shape=(1, 5, 12)):
    """GPT-2's exported MLP: a [tokens, features] matmul and bias, reshaped to [1, tokens,
    features] for a tanh GELU, reshaped back for the next matmul. ``operand`` replaces the
    GELU's 0.5; ``reader`` also reads the GELU's input (a second reader)."""
    half = operand if operand is not None else relax.const(0.5, "float32")

    def build(bb, x):
        h = bb.emit(relax.op.add(relax.op.matmul(x, _W1), _BIAS))
        r = bb.emit(relax.op.reshape(h, shape))
        t = bb.emit(relax.op.tanh(relax.op.multiply(r, relax.const(0.8, "float32"))))
        g = bb.emit(relax.op.multiply(relax.op.multiply(r, half), relax.op.add(
            t, relax.const(1.0, "float32"))))
        back = bb.emit(relax.op.reshape(g, [5, 12]))
        out = relax.op.matmul(back, _W2)
        return out if reader is None else relax.op.add(out, reader(bb, r))
    return relax.transform.Normalize()(_module((5, 8), build))


def test_an_elementwise_chain_between_reshapes_runs_on_the_unreshaped_tensor():
    before = _mlp()

    def build(bb, x):
        h = bb.emit(relax.op.add(relax.op.matmul(x, _W1), _BIAS))
        t = bb.emit(relax.op.tanh(relax.op.multiply(h, relax.const(0.8, "float32"))))
        g = bb.emit(relax.op.multiply(relax.op.multiply(h, relax.const(0.5, "float32")),
                                      relax.op.add(t, relax.const(1.0, "float32"))))
        return relax.op.matmul(g, _W2)
    expected = relax.transform.Normalize()(_module((5, 8), build))
    after = ElementwiseUnderReshape()(before)
    tvm.ir.assert_structural_equal(after, expected)
    _same_numbers(before, after, (5, 8))


@pytest.mark.parametrize("case", ["per_row_operand", "other_reader", "last_axis_split"])
def test_chains_that_depend_on_the_reshaped_shape_stay(case):
    """A per-token operand broadcasts along another axis once unreshaped; a reader of the
    chain that is no elementwise op needs the reshaped tensor; a reshape that splits the last
    axis changes what a vector along it means."""
    if case == "per_row_operand":
        before = _mlp(operand=relax.const(RNG.standard_normal((5, 1)).astype(np.float32)))
    elif case == "other_reader":
        before = _mlp(reader=lambda bb, r: relax.op.sum(r))
    else:
        before = _mlp(shape=(1, 5, 3, 4))
    after = ElementwiseUnderReshape()(before)
    tvm.ir.assert_structural_equal(after, before)


def _heads(part, perm):
    return relax.op.permute_dims(relax.op.reshape(part, [1, 5, 2, 4]), perm)


def test_a_split_becomes_one_slice_per_part():
    """GPT-2's queries, keys and values split from one projection and each transposed into
    heads: each transpose then reads its part of the projection in place."""
    def build(bb, x):
        parts = bb.emit(relax.op.split(x, [8, 16], axis=-1))
        q = bb.emit(_heads(relax.TupleGetItem(parts, 0), [0, 2, 1, 3]))
        k = bb.emit(_heads(relax.TupleGetItem(parts, 1), [0, 2, 3, 1]))
        return relax.op.add(relax.op.sum(q), relax.op.sum(k))
    before = relax.transform.Normalize()(_module((1, 5, 24), build))

    def sliced(bb, x):
        parts = [bb.emit(relax.op.strided_slice(x, [2], [begin], [end], assume_inbound=True))
                 for begin, end in ((0, 8), (8, 16))]
        q = bb.emit(_heads(parts[0], [0, 2, 1, 3]))
        k = bb.emit(_heads(parts[1], [0, 2, 3, 1]))
        return relax.op.add(relax.op.sum(q), relax.op.sum(k))
    expected = relax.transform.Normalize()(_module((1, 5, 24), sliced))
    after = relax.transform.DeadCodeElimination()(SplitIntoSlices()(before))
    tvm.ir.assert_structural_equal(after, expected)
    _same_numbers(before, after, (1, 5, 24))
