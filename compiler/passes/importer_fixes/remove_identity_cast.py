"""RemoveIdentityCast: ``astype(x, d)`` where ``x`` already has dtype ``d`` becomes ``x``.

Why: transformers' eager attention casts the softmax's probabilities to the value's dtype
(``attn_weights.type(value.dtype)``), and the export keeps the cast when both are float32.
Between the softmax and the product with V it hid GPT-2's attention from FuseAttention: its
prefill ran the scores, the softmax and the product as four kernels of their own.

Where: with the other importer clean-ups, before FuseAttention. Only casts to the dtype the
value already has are removed."""

from __future__ import annotations

import tvm
from tvm.relax.dpl import is_op, wildcard

from ..pattern_rewrite import rewrite_module


def _rewrite(orig, matches, source):
    """``orig``: the cast, or the variable bound to it (rewrite_call passes either): its type
    holds the dtype cast to."""
    x = matches[source]
    before, after = getattr(x.ty, "dtype", None), getattr(orig.ty, "dtype", None)
    return x if before is not None and str(before) == str(after) else orig


@tvm.transform.module_pass(opt_level=0, name="RemoveIdentityCast")
class RemoveIdentityCast:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        source = wildcard()
        pattern = is_op("relax.astype")(source)
        return rewrite_module(mod, pattern, lambda orig, matches: _rewrite(orig, matches, source),
                              opaque_constants=True)  # reads dtypes only
