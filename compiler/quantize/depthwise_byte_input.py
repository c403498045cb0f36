"""DepthwiseByteInput: in an int8 model, a float32 depthwise conv whose input is clipped to
[0, hi] (ReLU6) reads that input as uint8.

Why: depthwise convs have no int8 kernel and stay float32 (contraction_sites.py), and their
input is the largest tensor of an inverted-residual block (MobileNetV2's 112x112x96 expand
output). DepthwiseHalfInput halves it to float16; a clipped input fits one byte: 0..hi in 255
steps, the grid onnxruntime's QDQ models use for it too. The expand conv's epilogue then writes
a quarter of the float32 bytes and the depthwise kernel reads them, widening each input once
into its window (cpu_depthwise.py); ``vpmovzxbd`` + ``vcvtdq2ps`` cost what ``vcvtph2ps`` does.

The clip's bounds give the range, so no calibration is needed: scale = hi / 255, zero point 0.
Zero point 0 is what makes it exact at the borders: the conv zero-pads its uint8 input, and
0 is the value 0.0. The scale is folded into the (constant) weights, so the kernel sums
``float(q) * (W * scale)`` in float32. Error: half a step (hi / 510) per input, the same as
the int8 conv after it already has on its own input.

How: ``conv2d(x, W)`` with groups = channels, NHWC, float32, ``x = clip(v, 0, hi)`` (relax's
clip or minimum/maximum with constants) used by this conv alone and W a constant becomes
``conv2d(quantize(x, hi/255, 0, uint8), W * hi/255, out_dtype=float32)``. FuseOps puts the
quantize into the producer's epilogue; widening_conv.py legalizes the conv with the widening
before the padding. Depthwise convs with other inputs are left to DepthwiseHalfInput.

It pays only together with FoldIntoQuantize, which drops the relu6 the quantize repeats and
folds the scales into one multiply-add; without it the expand convs' uint8 epilogue costs
more than the bytes saved. Measurements:
docs/design/measurements.md#compilerquantizedepthwise_byte_inputpy.

Where: quantize phase, after RealizeInt8 and before DepthwiseHalfInput; only when int8 sites
were annotated (``enabled``)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..passes.lowering.half_in_float32 import with_float32_out
from ..relax_walk import RewriteWhenEnabled, one_value, op_name
from .depthwise_half_input import DepthwiseInputs

U8_LEVELS = 255
_MOVES_VALUES = ("relax.permute_dims", "relax.reshape")  # same values, other places


def clip_upper_bound(expr, values: dict) -> float | None:
    """hi when ``expr`` is clip(v, 0, hi) with 0 < hi finite, written as relax.clip or as
    minimum/maximum with scalar constants in either order, possibly behind layout changes
    (permute_dims, reshape: a torch model's NCHW clip between the NHWC convs); else None."""
    while op_name(expr) in _MOVES_VALUES:
        expr = values.get(expr.args[0])
    name = op_name(expr)
    if name == "relax.clip":
        low, high = one_value(expr.args[1]), one_value(expr.args[2])
        return high if low == 0.0 and high is not None and 0 < high < np.inf else None
    if name not in ("relax.minimum", "relax.maximum"):
        return None
    inner = values.get(expr.args[0])
    bound = one_value(expr.args[1])
    if bound is None or op_name(inner) not in ("relax.minimum", "relax.maximum") \
            or op_name(inner) == name:
        return None
    other = one_value(inner.args[1])
    low, high = (other, bound) if name == "relax.minimum" else (bound, other)
    return high if low == 0.0 and high is not None and 0 < high < np.inf else None


def _byte_input(builder, call: relax.Call, value, values) -> relax.Expr | None:
    high = clip_upper_bound(value, values)
    if high is None or not isinstance(call.args[1], tvm.ir.expr.Constant):
        return None
    scale = np.float32(high / U8_LEVELS)
    quantized = builder.emit(relax.op.quantize(
        call.args[0], relax.const(scale, "float32"), relax.const(0, "int32"), axis=-1,
        out_dtype="uint8"), "x_u8")
    weight = relax.const((call.args[1].value.numpy() * scale).astype(np.float32))
    return relax.Call(call.op, [quantized, weight], with_float32_out(call.attrs))


@tvm.transform.module_pass(opt_level=0, name="DepthwiseByteInput")
class DepthwiseByteInput(RewriteWhenEnabled):
    """``enabled``: int8 sites were annotated (compile options carry calibrated ranges)."""

    rewriter = staticmethod(lambda mod: DepthwiseInputs(mod, _byte_input))
