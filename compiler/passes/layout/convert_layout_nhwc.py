"""ConvertLayoutNHWC: conv2d to NHWC data / HWIO weights, or the module unchanged.

Why: with channels innermost in both the output and the weights, the CPU contraction schedule
vectorizes over output channels with contiguous loads. TVM's ConvertLayout rejects a whole
graph when one op has no layout rule (seen: a tuple-returning dropout, a 5-D stack; the
importer clean-ups before this pass remove those two); then the model stays NCHW, where the
same schedule vectorizes along the image width instead: slower, still correct. The fallback is
logged, not silent.

``clip`` with constant bounds becomes ``minimum(maximum(x, low), high)`` first: TVM 0.27 has no
layout rule for ``relax.clip``, so ConvertLayout kept every clip in NCHW between two transposes
(MobileNetV3's hard-swish and hard-sigmoid: ``x * clip(x + 3, 0, 6) / 6``), and a transpose,
being no elementwise op, stops FuseOps from fusing the activation into the conv before it.
maximum and minimum are broadcast ops with a layout rule; their legalization
(default_schedules/nan_minmax.py) passes NaN through as the clip's does. An infinite bound
(one-sided Clip) gets no op.

Where: after constant folding (so the weight transposes it inserts fold away), before
legalization.
"""

from __future__ import annotations

import logging
import math

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from aotc.errors import meaningful_line

from ...relax_walk import one_value
from ..pattern_rewrite import rewrite_module

LOG = logging.getLogger("aotc.passes")

DESIRED_LAYOUTS = {
    "relax.nn.conv2d": ["NHWC", "HWIO"],
    # Pinned to NCHW: otherwise it inherits NHWC from its producer, and TVM 0.27 cannot legalize
    # an NHWC conv2d_transpose (codegen failed on every segmentation head with learned
    # upsampling). Transposes around it are the price until it gets an NHWC kernel.
    "relax.nn.conv2d_transpose": ["NCHW", "IOHW"],
}


@tvm.transform.module_pass(opt_level=0, name="ConvertLayoutNHWC")
class ConvertLayoutNHWC:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = clip_as_maximum_minimum(mod)
        try:
            return relax.transform.ConvertLayout(DESIRED_LAYOUTS)(mod)
        except Exception as err:  # TVM raises InternalError
            reason = meaningful_line(err) or type(err).__name__
            LOG.warning("ConvertLayout to NHWC refused this model, keeping NCHW: %s", reason)
            return mod


def clip_as_maximum_minimum(mod: tvm.IRModule) -> tvm.IRModule:
    """Every float ``clip(x, low, high)`` with constant bounds as ``minimum(maximum(x, low),
    high)`` (see the module docstring)."""
    pattern = is_op("relax.clip")(wildcard(), wildcard(), wildcard())

    def rewrite(expr, _matchings):
        x = expr.args[0]
        dtype = str(getattr(x.ty, "dtype", ""))
        low, high = one_value(expr.args[1]), one_value(expr.args[2])
        if not dtype.startswith(("float", "bfloat")) or low is None or high is None or \
                math.isnan(low) or math.isnan(high):
            return expr
        out = x
        if low > -math.inf:
            out = relax.op.maximum(out, relax.const(low, dtype))
        if high < math.inf:
            out = relax.op.minimum(out, relax.const(high, dtype))
        return out

    return rewrite_module(mod, pattern, rewrite)
