"""CollapseLayoutChains: chains of pure layout ops become one op.

- ``reshape(reshape|squeeze|expand_dims|flatten(x), s)`` becomes ``reshape(x, s)``: each of
  the inner ops only renames the shape of the same row-major data.
- ``permute_dims(permute_dims(x, a), b)`` becomes one ``permute_dims`` with the composed axes,
  or ``x`` when they cancel (the inner one must have no other reader, else its copy stays and
  the composed one would be a second copy).

Why: exporters emit such chains around attention and flattening (torch's MHA: reshape,
transpose, reshape, transpose per projection). FuseOps would put a chain in one kernel anyway,
but every op in it is one more index computation per element, and a cancelled transpose pair
is a copy less; the chains also hide patterns from the passes after this one.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...relax_walk import single_use_values
from ..pattern_rewrite import rewrite_module

_SHAPE_ONLY = ("relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.flatten")


def _reshape_chain():
    x = wildcard()
    inner = is_op(_SHAPE_ONLY[0])(x, wildcard())
    for name in _SHAPE_ONLY[1:]:
        inner = inner | is_op(name)(x)
    return is_op("relax.reshape")(inner, wildcard()), x


def _permute_chain():
    x = wildcard()
    inner = is_op("relax.permute_dims")(x)
    return is_op("relax.permute_dims")(inner), inner, x


def _axes(call) -> list[int] | None:
    axes = call.attrs.axes
    return None if axes is None else [int(a) for a in axes]


@tvm.transform.module_pass(opt_level=0, name="CollapseLayoutChains")
class CollapseLayoutChains:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        reshape, x = _reshape_chain()
        mod = rewrite_module(mod, reshape, lambda expr, m: relax.op.reshape(m[x], expr.args[1]),
                             opaque_constants=True)  # reads shapes only
        permute, inner, source = _permute_chain()
        single_use = single_use_values(mod)

        def compose(expr, m):
            first, second = _axes(m[inner]), _axes(expr)
            if first is None or second is None or m[inner] not in single_use:
                return expr
            axes = [first[b] for b in second]
            if axes == list(range(len(axes))):
                return m[source]
            return relax.op.permute_dims(m[source], axes)
        return rewrite_module(mod, permute, compose)
