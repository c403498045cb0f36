"""RemoveInferenceDropout: ``dropout(x)[0]`` becomes ``x``.

Why: at inference Dropout is the identity, but TVM 0.27's ONNX importer keeps ``R.nn.dropout``,
which returns an (output, mask) tuple that DecomposeOpsForInference leaves alone. ConvertLayout
fails on that tuple ("Expected nested to match tuple"), which kept AlexNet and SqueezeNet of the
light zoo in NCHW layout.

Where: with the other importer clean-ups, before ``ConvertLayoutNHWC``. A dropout whose mask
(element 1) is used is left alone.
"""

from __future__ import annotations

import tvm
from tvm.relax.dpl import is_op, is_tuple_get_item, wildcard

from ..pattern_rewrite import rewrite_module


@tvm.transform.module_pass(opt_level=0, name="RemoveInferenceDropout")
class RemoveInferenceDropout:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        source = wildcard()
        pattern = is_tuple_get_item(is_op("relax.nn.dropout")(source), 0)
        return rewrite_module(mod, pattern, lambda _orig, matches: matches[source])
