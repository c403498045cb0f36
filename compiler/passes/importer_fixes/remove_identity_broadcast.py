"""RemoveIdentityBroadcast: ``broadcast_to(x, s)`` where ``x`` already has shape ``s`` becomes
``x``.

Why: TVM 0.27's ONNX importer broadcasts every input of a variadic op (``Sum``, ``Max``...) to
the common shape, even when all shapes already agree. ConvertLayout does not convert
broadcast_to, so in an NHWC graph each one is wrapped in transposes: kernels that run for
nothing at every residual join.

Where: with the other importer clean-ups, before ``ConvertLayoutNHWC``. Only exact identities
(statically equal shapes) are removed; real broadcasts stay.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm.relax.dpl import is_op, wildcard

from ..pattern_rewrite import rewrite_module


def _shape(expr):
    ty = expr.ty
    return getattr(ty, "shape", None)


def _rewrite(orig, matches, source):
    x = matches[source]
    before, after = _shape(x), _shape(orig)
    if before is None or after is None or not tvm_ffi.structural_equal(before, after):
        return orig
    return x


@tvm.transform.module_pass(opt_level=0, name="RemoveIdentityBroadcast")
class RemoveIdentityBroadcast:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        source = wildcard()
        pattern = is_op("relax.broadcast_to")(source, wildcard())
        return rewrite_module(mod, pattern, lambda orig, matches: _rewrite(orig, matches, source),
                              opaque_constants=True)  # reads shapes only
