"""FoldChannelAffine: an inference BatchNorm chain (subtract mean, divide std, multiply gamma,
add beta) after a conv, and a scale after a matmul, fold into the weights plus one add; the
module computes the same numbers before and after; a scale that varies along another axis
is left alone."""

import numpy as np
import tvm
from relax_helpers import main_ops
from tvm import relax

from aotc.compiler.passes import FoldChannelAffine

RNG = np.random.default_rng(0)


def _const(shape):
    return relax.const(RNG.uniform(0.5, 1.5, shape).astype(np.float32))


def _conv_bn_module(channel_shape=(1, 4, 1, 1)):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, _const((4, 3, 3, 3)), padding=[1, 1]))
            y = bb.emit(relax.op.subtract(y, _const(channel_shape)))
            y = bb.emit(relax.op.divide(y, _const(channel_shape)))
            y = bb.emit(relax.op.multiply(y, _const(channel_shape)))
            y = bb.emit(relax.op.add(y, _const(channel_shape)))
            m = bb.emit(relax.op.multiply(relax.op.matmul(relax.op.reshape(y, [1, 256]),
                                                          _const((256, 5))), _const((5,))))
            out = bb.emit_output(relax.op.nn.relu(m))
        bb.emit_func_output(out)
    return bb.get()



def _run(mod, x):
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_batchnorm_chain_and_matmul_scale_fold_into_weights():
    before = _conv_bn_module()
    after = FoldChannelAffine()(before)
    ops = main_ops(after)
    assert "relax.subtract" not in ops and "relax.divide" not in ops
    assert "relax.multiply" not in ops
    assert ops.count("relax.add") == 1 and ops.count("relax.nn.conv2d") == 1
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)


def test_a_scale_along_another_axis_is_left_alone():
    before = _conv_bn_module(channel_shape=(1, 1, 8, 1))  # varies along H, not channels
    after = FoldChannelAffine()(before)
    assert main_ops(after).count("relax.divide") == 1
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)


def test_a_producer_with_other_readers_is_not_duplicated():
    """GELU reads the FFN output three times; folding each scale into its own copy of the
    matmul made BERT 25% slower."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.matmul(x, _const((16, 8))), _const((8,))))
            half = bb.emit(relax.op.multiply(y, relax.const(np.float32(0.5))))
            scaled = bb.emit(relax.op.divide(y, relax.const(np.float32(1.4142135))))
            out = bb.emit_output(relax.op.multiply(half, relax.op.erf(scaled)))
        bb.emit_func_output(out)
    before = bb.get()
    after = FoldChannelAffine()(before)
    assert main_ops(after).count("relax.matmul") == 1
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)
