"""WinogradConv on a small NHWC graph: a 3x3 conv (+bias, ReLU) over 28x28x16 -> 32, then a
3x3 conv with stride 2, a 3x3 conv over 14x14 with 8 input channels and one over 7x7x16.

After the pass (AVX-512: 16 lanes) only the first is Winograd F(4x4, 3x3): call_tir
winograd_input -> winograd_matmul (weights [36, 2, 16, 16, 1]) -> winograd_output, the input
transform opaque to FuseOps; bias and ReLU stay after it, for FuseOps to fuse into the output
transform. The strided conv (no Winograd form), the 8-channel one (too short a reduction) and
the 7x7 one (16 tiles of 2: below the 49 a transformed weight needs) stay Relax conv2d ops.
14x14 with 16 channels takes tiles of 2 (49 of them). With no lanes (a GPU target) nothing
changes. Numbers: the direct conv's within 1e-4 (the transforms round differently)."""

import numpy as np
import tvm
from relax_helpers import assert_lanes_keep_numbers, main_ops
from tvm import relax

from aotc.compiler.passes.layout import WinogradConv
from aotc.compiler.passes.layout.winograd_conv import tile_size

RNG = np.random.default_rng(0)


def _const(*shape):
    return relax.const((RNG.standard_normal(shape) / np.sqrt(np.prod(shape[:-1])))
                       .astype(np.float32))


def _conv(x, weight, stride=1):
    return relax.op.nn.conv2d(x, weight, strides=[stride, stride], padding=[1, 1],
                              data_layout="NHWC", kernel_layout="HWIO")


def _module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 28, 28, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(_conv(x, _const(3, 3, 16, 32)))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, _const(32))))
            y = bb.emit(_conv(y, _const(3, 3, 32, 8), stride=2))
            y = bb.emit(_conv(y, _const(3, 3, 8, 16), stride=2))
            out = bb.emit_output(_conv(y, _const(3, 3, 16, 16)))
        bb.emit_func_output(out)
    return bb.get()


def _calls(mod):
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(
        (e.args[0].name_hint, [list(a.ty.shape) for a in e.args[1].fields]))
        if isinstance(e, relax.Call) and e.op.name == "relax.call_tir" else None)
    return calls


def test_structure():
    after = WinogradConv(16)(_module())
    calls = _calls(after)
    assert [name for name, _ in calls] == ["winograd_input", "winograd_matmul",
                                           "winograd_output"]
    assert [int(d) for d in calls[1][1][1]] == [36, 2, 16, 16, 1]
    kernels = {gv.name_hint: f for gv, f in after.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc)}
    assert int(kernels["winograd_input"].attrs["op_pattern"]) == 8
    ops = main_ops(after)
    assert ops.count("relax.nn.conv2d") == 3
    assert ops.index("relax.add") > ops.index("relax.call_tir") and "relax.nn.relu" in ops


def test_tile_size_follows_the_tile_count():
    assert tile_size(1, 28, 28) == 4    # 49 tiles of 4
    assert tile_size(1, 14, 14) == 2    # 16 of 4, 49 of 2
    assert tile_size(4, 7, 7) == 2      # a batch of 4: 64 tiles of 2
    assert tile_size(1, 7, 7) is None


def test_no_lanes_no_change():
    before = _module()
    tvm.ir.assert_structural_equal(WinogradConv(None)(before), before)


def test_numbers_match_the_direct_conv():
    before = _module()
    x = RNG.standard_normal((1, 28, 28, 16)).astype(np.float32)
    assert_lanes_keep_numbers(WinogradConv, before, x, (16, 4), 1e-4)


def test_padded_output_channels_keep_the_direct_conv():
    """A 3x3 conv of 24 output channels packs padded to 32 on 16 lanes (PrepackWeights), but
    the Winograd weight transform packs whole blocks only: it stays a direct conv. With 8
    lanes, 24 channels are 3 whole blocks and it becomes Winograd kernels."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 28, 28, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(_conv(x, _const(3, 3, 16, 24)))
        bb.emit_func_output(out)
    before = bb.get()
    tvm.ir.assert_structural_equal(WinogradConv(16)(before), before)
    assert "relax.nn.conv2d" not in main_ops(WinogradConv(8)(before))
    x = RNG.standard_normal((1, 28, 28, 16)).astype(np.float32)
    assert_lanes_keep_numbers(WinogradConv, before, x, (16, 8), 1e-4)
