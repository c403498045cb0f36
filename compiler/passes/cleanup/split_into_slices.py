"""SplitIntoSlices: a split of a static tensor becomes one strided slice per part.

Why: a split has several outputs, and FuseOps fuses an op into its consumers only through a
single output, so a split was a kernel of its own that copied every part before its readers
ran. GPT-2's exported attention splits its [tokens, 3 x features] projection into queries,
keys and values and then reshapes and transposes each into heads: the copy, then three
transposing copies of the copies. As slices, each part is read in place by the kernel that
transposes it.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...frontends.relax_shapes import static_shape, static_values
from ...relax_walk import mutate_functions, op_name


def _bounds(call) -> list[tuple[int, int]] | None:
    """(begin, end) of each part along the split axis, from the split's output types."""
    parts = getattr(call.ty, "fields", None)
    if parts is None:
        return None
    bounds, begin = [], 0
    axis = int(call.attrs.axis)
    for part in parts:
        shape = static_values(getattr(part, "shape", None))
        if shape is None:
            return None
        bounds.append((begin, begin + shape[axis]))
        begin += shape[axis]
    return bounds


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if op_name(call) != "relax.split" or static_shape(call.args[0]) is None:
            return call
        bounds = _bounds(call)
        if bounds is None:
            return call
        axis = int(call.attrs.axis) % len(static_shape(call.args[0]))
        return relax.Tuple([self.builder_.emit(relax.op.strided_slice(
            call.args[0], axes=[axis], begin=[begin], end=[end], assume_inbound=True))
            for begin, end in bounds])


@tvm.transform.module_pass(opt_level=0, name="SplitIntoSlices")
class SplitIntoSlices:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = mutate_functions(mod, _Rewriter(mod))
        return relax.transform.CanonicalizeBindings()(mod)
