"""ConvertFP16 on a chain of three NHWC 3x3 convs: the first two become float16 kernels
(call_tir named conv2d_fp16) fed by float16 conversions of their inputs; the last, which sums
9 x 544 = 4,896 products (over the pass's 4,608), stays a float32 Relax conv2d. Disabled (any
other precision), the pass leaves the module as it is. Numbers: the converted module against
the float32 one, cosine > 0.9999 (float16 sums)."""

import numpy as np
from relax_helpers import run_main
from tvm import relax

from aotc.compiler.quantize.fp16 import ConvertFP16

RNG = np.random.default_rng(0)


def _module(ic_long: int):
    """x -> conv 3x3 (8->32) -> conv 3x3 (32->ic_long) -> conv 3x3 (ic_long->16): the last
    conv sums 9*ic_long products."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6, 6, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i, (ic, oc) in enumerate([(8, 32), (32, ic_long), (ic_long, 16)]):
                w = relax.const((RNG.standard_normal((3, 3, ic, oc)) / np.sqrt(9 * ic))
                                .astype(np.float32))
                h = bb.emit(relax.op.nn.conv2d(h, w, padding=1, data_layout="NHWC",
                                               kernel_layout="HWIO"))
                if i < 2:
                    h = bb.emit(relax.op.nn.relu(h))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def test_pass_ir_before_after():
    mod = _module(ic_long=544)
    before = mod.script()
    assert "conv2d_fp16" not in before and before.count("R.nn.conv2d") == 3
    after = ConvertFP16(True)(mod)
    text = after.script()
    assert text.count("R.nn.conv2d") == 1 and text.count("R.call_tir(cls.conv2d_fp16") == 2
    assert text.count("R.astype") == 2 and '"float16"' in text
    assert ConvertFP16(False)(mod).script() == before
    x = RNG.standard_normal((1, 6, 6, 8)).astype(np.float32)
    want, got = run_main(mod, x), run_main(after, x)
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.9999, cos
