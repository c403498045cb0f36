"""PrepackWeights on a small NHWC graph: a conv2d (+bias, ReLU) with 32 output channels, a
depthwise conv2d, a conv2d with 24 output channels, a matmul (+bias) with 16 rows and one
with 13 rows.

After the pass (AVX-512: 16 lanes): the 32-channel conv and the 16-row matmul are packed
kernels (call_tir conv2d_packed / matmul_packed) with weights [2, 3, 3, 3, 16, 1] and
[1, 40, 16, 1]; the depthwise conv (no packed kernel), the 24-channel conv (not whole blocks
of 16) and the 13-row matmul (no row tile between 4 and 8) are still Relax ops; bias and ReLU
stay after the kernels. With 8 lanes (AVX2) the 24-channel conv is packed too; with none (a GPU
target) nothing changes. Numbers: equal to the original (same products, same order)."""

import numpy as np
import tvm
from tvm import relax

from aotc.compiler.passes.layout import PrepackWeights
from relax_helpers import assert_lanes_keep_numbers, main_ops

RNG = np.random.default_rng(0)


def _const(*shape):
    return relax.const(RNG.standard_normal(shape).astype(np.float32) * 0.3)


def _module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, _const(3, 3, 3, 32), padding=[1, 1],
                                           data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, _const(32))))
            y = bb.emit(relax.op.nn.conv2d(y, _const(3, 3, 1, 32), padding=[1, 1], groups=32,
                                           data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(relax.op.nn.conv2d(y, _const(1, 1, 32, 24), data_layout="NHWC",
                                           kernel_layout="HWIO"))
            y = bb.emit(relax.op.reshape(y, [16, 96]))
            y = bb.emit(relax.op.add(relax.op.matmul(y, _const(96, 32)), _const(32)))
            y = bb.emit(relax.op.strided_slice(y, axes=[0], begin=[0], end=[13]))
            out = bb.emit_output(relax.op.matmul(y, _const(32, 16)))
        bb.emit_func_output(out)
    return bb.get()


def _kernels(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_structure():
    after = PrepackWeights(16)(_module())
    ops = main_ops(after)
    assert ops.count("relax.nn.conv2d") == 2   # depthwise and the 24-channel one
    assert ops.count("relax.matmul") == 1      # the 13-row one
    kernels = _kernels(after)
    assert sorted(kernels) == ["conv2d_packed", "matmul_packed"]
    shapes = {}
    relax.analysis.post_order_visit(after["main"], lambda e: shapes.update(
        {e.args[0].name_hint: [int(d) for d in e.args[1].fields[1].value.shape]})
        if isinstance(e, relax.Call) and e.op.name == "relax.call_tir" else None)
    assert shapes == {"conv2d_packed": [2, 3, 3, 3, 16, 1], "matmul_packed": [2, 96, 16, 1]}
    assert ops.count("relax.add") == 2 and ops.count("relax.nn.relu") == 1


def test_lanes_follow_the_target():
    assert sorted(_kernels(PrepackWeights(8)(_module()))) == \
        ["conv2d_packed", "conv2d_packed1", "matmul_packed"]
    before = _module()
    tvm.ir.assert_structural_equal(PrepackWeights(None)(before), before)


def test_numbers_unchanged():
    before = _module()
    x = RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    assert_lanes_keep_numbers(PrepackWeights, before, x, (16, 8, 4), 1e-5)
