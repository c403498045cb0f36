"""FoldRemainingConstants: the module TVM's FoldConstant makes, without running it where it
has nothing to evaluate."""

import numpy as np
import pytest
import tvm
from tvm import relax

from aotc.compiler.explain import op_counts
from aotc.compiler.passes import FoldRemainingConstants
from aotc.compiler.passes.folding import fold_remaining_constants as pass_module

RNG = np.random.default_rng(0)
WEIGHT = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
BIAS = RNG.standard_normal((1, 4, 1, 1)).astype(np.float32)
X = relax.TensorType([1, 3, 6, 6], "float32")


def _after_numpy_folding():
    """What FoldConstantsNumpy leaves: variables bound to the constants it computed, one of
    them read by nothing any more."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", X)
    with bb.function("main", [x]):
        with bb.dataflow():
            w = bb.emit(relax.const(WEIGHT))
            bb.emit(relax.const(np.float32(1.0)))  # its reader was folded
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1]))
            b = bb.emit(relax.const(BIAS))
            out = bb.emit_output(relax.op.add(y, b))
        bb.emit_func_output(out)
    return bb.get()


def _expected():
    bb = relax.BlockBuilder()
    x = relax.Var("x", X)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(WEIGHT), padding=[1, 1, 1, 1]))
            out = bb.emit_output(relax.op.add(y, relax.const(BIAS)))
        bb.emit_func_output(out)
    return bb.get()


def _no_tvm_fold(monkeypatch):
    def refuse():
        raise AssertionError("TVM's FoldConstant ran")
    monkeypatch.setattr(pass_module.relax.transform, "FoldConstant", refuse)


def test_constants_inlined_and_dead_bindings_dropped_without_tvm_fold(monkeypatch):
    before = _after_numpy_folding()
    theirs = relax.transform.FoldConstant()(before)
    _no_tvm_fold(monkeypatch)
    after = FoldRemainingConstants()(before)
    tvm.ir.assert_structural_equal(after, _expected())
    tvm.ir.assert_structural_equal(after, theirs)
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    outputs = []
    for mod in (before, after):
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        outputs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_array_equal(outputs[1], outputs[0])


def test_a_module_with_nothing_to_do_is_returned_as_it_is(monkeypatch):
    mod = _expected()
    _no_tvm_fold(monkeypatch)
    tvm.ir.assert_structural_equal(FoldRemainingConstants()(mod), mod)


def _foldable(op):
    """A run-time add of a constant that ``op`` computes from constants only."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2], "int32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            seven = bb.emit(relax.const(np.array([7, -7], "int32")))
            folded = bb.emit(op(seven))
            out = bb.emit_output(relax.op.add(x, folded))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("op", [
    lambda c: relax.op.divide(c, relax.const(np.array([2, 2], "int32"))),  # integer division
    lambda c: relax.op.zeros((2,), "int32"),                               # no arguments
], ids=["constant-arguments", "creation-op"])
def test_calls_of_constants_go_to_tvm_fold(op):
    before = _foldable(op)
    after = FoldRemainingConstants()(before)
    tvm.ir.assert_structural_equal(after, relax.transform.FoldConstant()(before))
    ops = op_counts(after)
    assert ops["divide"] == ops["zeros"] == 0 and ops["add"] == 1


def test_reads_of_run_time_values_and_shape_ops_decide(monkeypatch):
    x = relax.Var("x", X)
    known = {relax.Var("c", X)}
    assert pass_module._reads_runtime_value(x, known)
    assert pass_module._reads_runtime_value(relax.Tuple([relax.const(1.0), x]), known)
    assert not pass_module._reads_runtime_value(relax.Tuple([*known, relax.const(1.0)]), known)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        shape = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr([1, 3, 6, 6])))
        bb.emit_func_output(relax.op.add(shape, shape))
    ran = []
    monkeypatch.setattr(pass_module.relax.transform, "FoldConstant",
                        lambda: lambda mod: ran.append(mod) or mod)
    FoldRemainingConstants()(bb.get())
    assert ran  # a shape read as a tensor: TVM's FoldConstant evaluates it
