"""ResidualFromBF16 on a block after ConvertBF16: y = relu(conv_a(x)); out = (conv_b(y) +
shortcut(y)) + y, all three 1x1 convs bf16 kernels.

Before: y is converted twice (``to_bf16`` for conv_b and again for the shortcut conv) and the
last add reads the float32 y, so y has three users; the shortcut conv's float32 result is
read by the first add, which FuseOps puts into conv_b's kernel. After: one conversion of y,
read by both convs, and the last add reads ``from_bf16`` of it: the conversion is y's only
user (FuseOps then puts it into conv_a's kernel). The shortcut's result is converted too and
the first add reads it widened (``add_bf16``). Numbers: y on the residual path and the
shortcut's result are rounded to bfloat16 (relative error at most 2^-8 of each)."""

import numpy as np
import tvm
from relax_helpers import converted_parts, random_conv1x1, run_main
from tvm import relax

from aotc.compiler import dot_kernels
from aotc.compiler.quantize import ConvertBF16, ResidualFromBF16

SEED = 0
X = relax.TensorType((1, 8, 8, 16), "float32")


def _float_module(output: str = "out"):
    """The block; ``output`` "y" or "s": the model ends there (for the error bound)."""
    conv = random_conv1x1(np.random.default_rng(SEED))  # the same weights for each output
    bb = relax.BlockBuilder()
    x = relax.Var("x", X)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(conv(x, 16, 32)))
            z = bb.emit(conv(y, 32, 32))
            s = bb.emit(conv(y, 32, 32))
            t = bb.emit(relax.op.add(z, s))
            out = bb.emit_output(relax.op.add(t, y))
        bb.emit_func_output({"out": out, "y": y, "s": s}[output])
    return bb.get()


def _expected(before: tvm.IRModule) -> tvm.IRModule:
    """``before`` (ConvertBF16's output) as the pass should leave it, written out: its kernels
    and packed weights, one conversion of y, the last add reading from_bf16 of it."""
    kernels, gvs, weights = converted_parts(before)
    bits = relax.TensorType((1, 8, 8, 32), "uint16")
    y_type = relax.TensorType((1, 8, 8, 32), "float32")
    bb = relax.BlockBuilder(tvm.IRModule(kernels))
    x = relax.Var("x", X)
    with bb.function("main", [x]):
        with bb.dataflow():
            xb = bb.emit(relax.call_tir(gvs["to_bf16"], [x], relax.TensorType(X.shape, "uint16")))
            a = bb.emit(relax.call_tir(gvs["conv2d_bf16"], [xb, weights[0]], y_type))
            y = bb.emit(relax.op.nn.relu(a))
            yb = bb.emit(relax.call_tir(gvs["to_bf161"], [y], bits))
            z = bb.emit(relax.call_tir(gvs["conv2d_bf161"], [yb, weights[1]], y_type))
            s = bb.emit(relax.call_tir(gvs["conv2d_bf161"], [yb, weights[2]], y_type))
            sb = bb.emit_te(dot_kernels.to_bf16_bits, s, primfunc_name_hint="to_bf16")
            t = bb.emit(bb.call_te(dot_kernels.add_bf16_bits, z, sb,
                                   primfunc_name_hint="add_bf16"))
            y_again = bb.emit_te(dot_kernels.from_bf16_bits, yb, primfunc_name_hint="from_bf16")
            out = bb.emit_output(relax.op.add(t, y_again))
        bb.emit_func_output(out)
    return bb.get()


def test_one_conversion_and_the_add_reads_it_widened():
    before = ConvertBF16(True)(_float_module())
    conversions = [b for b in before["main"].body.blocks[0].bindings
                   if b.value.op.name == "relax.call_tir"
                   and b.value.args[0].name_hint.startswith("to_bf16")]
    assert len(conversions) == 3  # x once, y twice
    tvm.ir.assert_structural_equal(ResidualFromBF16()(before), _expected(before))


def test_nothing_to_reroute_without_bf16_convs():
    before = _float_module()
    tvm.ir.assert_structural_equal(ResidualFromBF16()(before), before)


def test_numbers_carry_y_and_the_shortcut_rounded_to_bfloat16():
    before = ConvertBF16(True)(_float_module())
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 16)).astype(np.float32)
    want = run_main(before, x)
    got = run_main(ResidualFromBF16()(before), x)
    y, s = (run_main(ConvertBF16(True)(_float_module(end)), x) for end in ("y", "s"))
    # y (the residual) and s (the shortcut) changed, each by at most 2^-8 of itself (round to
    # nearest, 8 significant bits); a little more for float32's own rounding of the sums
    bound = 2.0 ** -8 * (np.abs(y) + np.abs(s)) + 1e-6 * np.abs(want)
    assert np.all(np.abs(got - want) <= bound)
    assert not np.allclose(got, want, rtol=0, atol=1e-7)  # the residual did change
