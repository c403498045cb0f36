"""DepthwiseByteInput on a small NHWC graph: three depthwise 3x3 convs, each reading its input
alone, after relu6 written as clip, after relu6 written as minimum(maximum(x, 0), 6), and
after a plain relu; and a fourth after a clip whose output also feeds an add.

After the pass the two bounded inputs are quantized to uint8 (scale 6/255, zero point 0) and
their convs read bytes with the scale folded into the weights (out_dtype float32); the relu's
conv (no bound: DepthwiseHalfInput's) and the shared clip's stay float32. Numbers: within half
a quantization step per input, summed over the taps' weights. End to end: an int8 torch model
with an inverted-residual block compiles with its depthwise conv reading uint8 and matches
torch."""

import numpy as np
import pytest
import tvm
from helpers import assert_near_torch, inverted_residual_block
from relax_helpers import main_ops, run_main
from tvm import relax

from aotc.compiler.quantize import DepthwiseByteInput
from aotc.compiler.quantize.depthwise_byte_input import U8_LEVELS

RNG = np.random.default_rng(0)
CHANNELS = 16


def _weight():
    return RNG.standard_normal((3, 3, 1, CHANNELS)).astype(np.float32)


def _depthwise(x, weight):
    return relax.op.nn.conv2d(x, relax.const(weight), padding=[1, 1], groups=CHANNELS,
                              data_layout="NHWC", kernel_layout="HWIO")


def _module(weights):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 12, 12, CHANNELS), "float32"))
    six, zero = relax.const(np.float32(6)), relax.const(np.float32(0))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(_depthwise(bb.emit(relax.op.clip(x, 0, 6)), weights[0]))
            low = bb.emit(relax.op.maximum(a, zero))
            b = bb.emit(_depthwise(bb.emit(relax.op.minimum(low, six)), weights[1]))
            c = bb.emit(_depthwise(bb.emit(relax.op.nn.relu(b)), weights[2]))
            shared = bb.emit(relax.op.clip(c, 0, 6))
            d = bb.emit(_depthwise(shared, weights[3]))
            out = bb.emit_output(relax.op.add(d, shared))
        bb.emit_func_output(out)
    return bb.get()


def _convs(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.nn.conv2d"
        else None)
    return found


def test_structure():
    weights = [_weight() for _ in range(4)]
    after = DepthwiseByteInput(True)(_module(weights))
    convs = _convs(after)
    assert [(c.args[0].ty.dtype, c.ty.dtype) for c in convs] == [
        ("uint8", "float32"), ("uint8", "float32"), ("float32", "float32"),
        ("float32", "float32")]
    assert main_ops(after).count("relax.quantize") == 2
    scale = np.float32(6.0 / U8_LEVELS)
    for conv, weight in zip(convs[:2], weights[:2]):
        np.testing.assert_array_equal(conv.args[1].value.numpy(), weight * scale)
    for conv, weight in zip(convs[2:], weights[2:]):
        np.testing.assert_array_equal(conv.args[1].value.numpy(), weight)


def test_disabled_without_int8_sites():
    before = _module([_weight() for _ in range(4)])
    tvm.ir.assert_structural_equal(DepthwiseByteInput(False)(before), before)


def test_numbers_within_half_a_step_per_input():
    weights = [_weight() for _ in range(4)]
    before = _module(weights)
    x = (RNG.standard_normal((1, 12, 12, CHANNELS)) * 4).astype(np.float32)
    want = run_main(before, x)
    got = run_main(DepthwiseByteInput(True)(before), x)
    # each of the two quantized convs is off by at most sum|W| * step / 2; the later layers
    # carry it on (the relu and the clip do not grow it, the last conv sums it again)
    step_error = 6.0 / U8_LEVELS / 2
    bound = sum(float(np.abs(w).sum(axis=(0, 1, 2)).max()) for w in weights[:2]) * step_error
    bound *= 1 + float(np.abs(weights[2]).sum(axis=(0, 1, 2)).max()) * (
        1 + float(np.abs(weights[3]).sum(axis=(0, 1, 2)).max()))
    assert not np.array_equal(got, want)  # the pass did change the arithmetic
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)
    assert np.abs(got - want).mean() < 0.05 * np.abs(want).mean()


def test_an_int8_inverted_residual_block_reads_bytes_and_matches_torch(tmp_path):
    pytest.importorskip("torch")
    import torch

    import aotc
    from aotc.options import QuantizeOptions

    net = inverted_residual_block()
    calib = [RNG.standard_normal((1, 16, 28, 28)).astype(np.float32) for _ in range(8)]
    aotc.compile(net, output=tmp_path / "m.so", example_inputs=(torch.from_numpy(calib[0]),),
                 quantize=QuantizeOptions(calib, method="minmax"), dump_ir=tmp_path / "ir")
    (after,) = (tmp_path / "ir").glob("*_quantize_DepthwiseByteInput.py")
    assert "groups=64" in after.read_text().split("R.nn.conv2d(x_u8")[1].splitlines()[0]
    assert_near_torch(net, tmp_path / "m.so",
                      RNG.standard_normal((1, 16, 28, 28)).astype(np.float32), 0.05)
