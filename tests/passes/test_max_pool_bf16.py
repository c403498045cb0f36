"""MaxPoolBF16 after ConvertBF16 and ResidualFromBF16, on a stem: y = relu(conv_a(x));
p = max_pool(y) (3x3, stride 2, padded by 1, on an odd 13x13 image); out = conv_b(p), both
1x1 convs bf16 kernels.

Before: the pool reads the float32 y and its result is converted (``to_bf16``) for conv_b.
After: y is converted (the conversion is y's only user: FuseOps puts it into conv_a's kernel)
and the pool reads the bits, widening them itself (``max_pool2d_bf16``). Numbers: the same
bits, since rounding is monotone."""

import numpy as np
import tvm
from relax_helpers import converted_parts, random_conv1x1, run_main
from tvm import relax, topi

from aotc.compiler import dot_kernels
from aotc.compiler.quantize import ConvertBF16, MaxPoolBF16, ResidualFromBF16

X = relax.TensorType((1, 13, 13, 8), "float32")
POOL = {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1), "layout": "NHWC"}


def _float_module(pool_input_also_added: bool = False, pool_result_added: bool = False):
    """The stem; ``pool_input_also_added``: y is also added to itself (a second, float32
    reader); ``pool_result_added``: p is also squared (a float32 reader of the
    pool's result)."""
    conv = random_conv1x1(np.random.default_rng(0))
    bb = relax.BlockBuilder()
    x = relax.Var("x", X)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(conv(x, 8, 16)))
            p = bb.emit(relax.op.nn.max_pool2d(y, **POOL))
            out = conv(p, 16, 16)
            if pool_input_also_added:
                out = relax.op.add(bb.emit(out), relax.op.nn.max_pool2d(
                    bb.emit(relax.op.add(y, y)), **POOL))  # a pool read in float32, too
            if pool_result_added:
                out = relax.op.add(bb.emit(out), bb.emit(relax.op.multiply(p, p)))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def _converted(**kwargs) -> tvm.IRModule:
    return ResidualFromBF16()(ConvertBF16(True)(_float_module(**kwargs)))


def _expected(before: tvm.IRModule) -> tvm.IRModule:
    """``before`` as the pass should leave it, written out: y converted, the pool of its
    bits."""
    kernels, gvs, weights = converted_parts(before)
    bb = relax.BlockBuilder(tvm.IRModule(kernels))
    x = relax.Var("x", X)
    with bb.function("main", [x]):
        with bb.dataflow():
            xb = bb.emit(relax.call_tir(gvs["to_bf16"], [x], relax.TensorType(X.shape, "uint16")))
            a = bb.emit(relax.call_tir(gvs["conv2d_bf16"], [xb, weights[0]],
                                       relax.TensorType((1, 13, 13, 16), "float32")))
            y = bb.emit(relax.op.nn.relu(a))
            yb = bb.emit_te(dot_kernels.to_bf16_bits, y, primfunc_name_hint="to_bf16")
            p = bb.emit(bb.call_te(
                lambda bits: topi.nn.pool2d(dot_kernels.from_bf16_bits(bits), [3, 3], [2, 2],
                                            [1, 1], [1, 1, 1, 1], "max", layout="NHWC"),
                yb, primfunc_name_hint="max_pool2d_bf16"))
            pb = bb.emit(relax.call_tir(gvs["to_bf161"], [p],
                                        relax.TensorType((1, 7, 7, 16), "uint16")))
            out = bb.emit(relax.call_tir(gvs["conv2d_bf161"], [pb, weights[1]],
                                         relax.TensorType((1, 7, 7, 16), "float32")))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def test_the_pool_reads_its_input_as_bfloat16_bits():
    before = _converted()
    tvm.ir.assert_structural_equal(MaxPoolBF16()(before), _expected(before))


def test_the_same_bits_come_out():
    before = _converted()
    x = np.random.default_rng(1).standard_normal((1, 13, 13, 8)).astype(np.float32)
    np.testing.assert_array_equal(run_main(MaxPoolBF16()(before), x), run_main(before, x))


def test_pools_with_float32_readers_are_left_alone():
    """The pool's input read by another op too (its conversion could not fuse into the
    producer), or its result read in float32: nothing changes."""
    for kwargs in ({"pool_input_also_added": True}, {"pool_result_added": True}):
        before = _converted(**kwargs)
        tvm.ir.assert_structural_equal(MaxPoolBF16()(before), before)


def test_nothing_to_do_without_bf16():
    before = _float_module()
    tvm.ir.assert_structural_equal(MaxPoolBF16()(before), before)
