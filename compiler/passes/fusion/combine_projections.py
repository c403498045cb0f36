"""CombineProjections: matmuls that read the same input with constant weights (the Q, K and V
projections of attention; an MLP's gate and up) become one matmul with the weights
concatenated at compile time, plus one slice per original result. A constant bias added to
every one of them is concatenated too and added before slicing.

Why: the input is read once instead of once per projection, and the combined N is wide enough
for whole register tiles (three 64-wide projections of a 192-wide model are one 192-wide
kernel). TVM's CombineParallelMatmul does this only for weights that are function parameters,
never for the bound constants a compiled model has.

Only 2-D float weights with the same dtype and reduction size combine, and only when there are
at least two of them; a group that mixes biased and unbiased projections combines the matmuls
and leaves the adds after the slices.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from ...frontends.relax_shapes import static_shape
from ...relax_walk import single_use_values

_FLOAT = ("float16", "float32", "float64")


def _is_weight(expr) -> bool:
    """A 2-D float constant, judged by its type (reading its values would copy them all)."""
    return isinstance(expr, tvm.ir.GenericConst) and len(expr.value.shape) == 2 and \
        str(expr.value.dtype) in _FLOAT


def _groups(func: relax.Function) -> dict:
    """lhs var -> [(weight constant, bias constant or None)] for every matmul(lhs, constant);
    a bias is a constant added on either side (exporters write both ``b + x @ W`` and
    ``x @ W + b``)."""
    biases = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.add":
                lhs, rhs = value.args
                if isinstance(rhs, tvm.ir.GenericConst):
                    biases[lhs] = rhs
                elif isinstance(lhs, tvm.ir.GenericConst):
                    biases[rhs] = lhs
    groups = defaultdict(list)
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == \
                    "relax.matmul" and _is_weight(value.args[1]) and \
                    static_shape(value.args[0]) is not None:
                groups[value.args[0]].append((value.args[1], biases.get(binding.var)))
    return {lhs: entries for lhs, entries in groups.items() if _combinable(entries)}


def _combinable(entries) -> bool:
    if len(entries) < 2:
        return False
    return len({(int(w.value.shape[0]), str(w.value.dtype)) for w, _ in entries}) == 1


def _const(values: np.ndarray) -> relax.Constant:
    return relax.const(values, str(values.dtype))


class _Combined:
    """One group's concatenated weight (and bias) and each member's column range."""

    def __init__(self, entries):
        weights = [w.value.numpy() for w, _ in entries]
        # dtype given: relax.const makes float64 arrays float32 by default
        self.weight = _const(np.concatenate(weights, axis=1))
        self.ranges = {}
        start = 0
        for (const, _), w in zip(entries, weights):
            self.ranges[const] = (start, start + w.shape[1])
            start += w.shape[1]
        bias_values = [b.value.numpy() if b is not None else None for _, b in entries]
        self.bias = None
        if all(b is not None and b.shape in ((w.shape[1],), (1, w.shape[1]))
               for b, w in zip(bias_values, weights)):
            self.bias = _const(np.concatenate([b.reshape(-1) for b in bias_values]))


def combine_projections(func: relax.Function, single_use: set) -> relax.Function:
    combined = {lhs: _Combined(entries) for lhs, entries in _groups(func).items()}
    if not combined:
        return func
    # rewrite_call matches through bindings: a matched input that a binding computes (a
    # layer norm's output) arrives as the bound value, not as its variable
    bound_to = {b.value: b.var for block in func.body.blocks for b in block.bindings
                if b.var in combined}
    x, weight, bias = wildcard(), is_const(), is_const()
    matmul = is_op("relax.matmul")(x, weight)
    pattern = is_op("relax.add")(matmul, bias) | matmul

    def rewrite(expr, m):
        lhs = bound_to.get(m[x], m[x])
        group = combined.get(lhs)
        if group is None or m[weight] not in group.ranges:
            return expr
        start, end = group.ranges[m[weight]]
        biased = bias in m and group.bias is not None and m[matmul] in single_use
        if bias in m and not biased:
            return expr  # the add stays; its matmul operand is rewritten on its own
        out = relax.op.matmul(lhs, group.weight)
        if biased:
            out = relax.op.add(out, group.bias)
        rank = len(static_shape(lhs))
        return relax.op.strided_slice(out, axes=[rank - 1], begin=[start], end=[end])
    return rewrite_call(pattern, rewrite, func)


@tvm.transform.module_pass(opt_level=0, name="CombineProjections")
class CombineProjections:
    """See the module docstring. The identical combined matmuls the rewrite leaves (one per
    member) are merged by common subexpression elimination."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        single_use = single_use_values(mod)
        mod = mod.clone()  # the caller's module must not change (passes get it itself)
        changed = False
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                new = combine_projections(func, single_use)
                if not new.same_as(func):
                    mod[gv] = new
                    changed = True
        if not changed:
            return mod
        mod = relax.transform.EliminateCommonSubexpr()(mod)
        return relax.transform.DeadCodeElimination()(mod)
