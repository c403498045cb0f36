"""ConvertFP16 on a chain of three NHWC 3x3 convs: the first two become float16 kernels
(call_tir named conv2d_fp16) fed by float16 conversions of their inputs; the last, which sums
9 x 544 = 4,896 products (over the pass's 4,608), stays a float32 Relax conv2d. Disabled (any
other precision), the pass leaves the module as it is. Numbers: the converted module against
the float32 one, cosine > 0.9999 (float16 sums)."""

import numpy as np
import tvm
from relax_helpers import run_main
from tvm import relax

from aotc.compiler import dot_kernels
from aotc.compiler.quantize.fp16 import ConvertFP16

RNG = np.random.default_rng(0)


def _weights(ic_long: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((3, 3, ic, oc)) / np.sqrt(9 * ic)).astype(np.float32)
            for ic, oc in [(8, 32), (32, ic_long), (ic_long, 16)]]


def _module(ic_long: int, fp16_convs: int = 0):
    """x -> conv 3x3 (8->32) -> conv 3x3 (32->ic_long) -> conv 3x3 (ic_long->16): the last
    conv sums 9*ic_long products. ``fp16_convs``: how many of the convs, from the first, are
    written as ConvertFP16 writes them (the expected module): a float16 cast of the input
    and a packed float16 kernel over weights packed at compile time."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6, 6, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i, w in enumerate(_weights(ic_long)):
                if i < fp16_convs:
                    xh = bb.emit(relax.op.astype(h, "float16"))
                    # 544 channels are 17 blocks of 32: packed with one zero block more
                    shape = dot_kernels.conv_packed_shape(w.shape, dot_kernels.FP16,
                                                          whole_tiles=True)
                    packed = relax.const(dot_kernels.packed_tensor(
                        dot_kernels.pack_conv_weight, w, dot_kernels.FP16, shape))
                    h = bb.emit_te(dot_kernels.conv2d_nhwc, xh, packed, w.shape[3], [1, 1],
                                   [1, 1, 1, 1], [1, 1], 0, "NHWC",
                                   primfunc_name_hint="conv2d_fp16")
                else:
                    h = bb.emit(relax.op.nn.conv2d(h, relax.const(w), padding=1,
                                                   data_layout="NHWC", kernel_layout="HWIO"))
                if i < 2:
                    h = bb.emit(relax.op.nn.relu(h))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def test_pass_ir_before_after():
    mod = _module(ic_long=544)
    after = ConvertFP16(True)(mod)
    tvm.ir.assert_structural_equal(after, _module(ic_long=544, fp16_convs=2))
    tvm.ir.assert_structural_equal(ConvertFP16(False)(mod), _module(ic_long=544))
    x = RNG.standard_normal((1, 6, 6, 8)).astype(np.float32)
    want, got = run_main(mod, x), run_main(after, x)
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.9999, cos
