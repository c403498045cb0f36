"""ConvertLayoutNHWC: conv2d to NHWC data / HWIO weights, or the module unchanged.

Why: with channels innermost in both the output and the weights, the CPU contraction schedule
vectorizes over output channels with contiguous loads. TVM's ConvertLayout rejects a whole
graph when one op has no layout rule (seen: a tuple-returning dropout, a 5-D stack; the
importer clean-ups before this pass remove those two); then the model stays NCHW, where the
same schedule vectorizes along the image width instead: slower, still correct. The fallback is
logged, not silent.

Where: after constant folding (so the weight transposes it inserts fold away), before
legalization.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax

from aotc.errors import meaningful_line

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
        try:
            return relax.transform.ConvertLayout(DESIRED_LAYOUTS)(mod)
        except Exception as err:  # TVM raises InternalError
            reason = meaningful_line(err) or type(err).__name__
            LOG.warning("ConvertLayout to NHWC refused this model, keeping NCHW: %s", reason)
            return mod
