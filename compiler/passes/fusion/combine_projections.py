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


def combine_projections(mod: tvm.IRModule, func: relax.Function, single_use: set
                        ) -> relax.Function:
    combined = {lhs: _Combined(entries) for lhs, entries in _groups(func).items()}
    if not combined:
        return func
    return _Combine(mod, func, combined, single_use).visit_expr(func)


@relax.expr_functor.mutator
class _Combine(relax.PyExprMutator):
    """Each member's ``matmul(lhs, W)`` (with its constant bias, ``add`` on either side, when
    the group has every bias and the matmul has no other reader) becomes a slice of the
    group's combined matmul, emitted where the group's first member was. One walk over the
    bindings, not TVM's ``rewrite_call`` with a combined matmul per member merged by common
    subexpression elimination afterwards, which hashed every constant's values
    (docs/design/measurements.md)."""

    def __init__(self, mod, func, combined: dict, single_use: set):
        super().__init__(mod)
        self.combined = combined
        self.single_use = single_use
        self.values = relax.analysis.get_var2val(func)
        self.emitted: dict = {}  # (group, biased) -> its combined result in this block

    def _member(self, expr):
        """(matmul call, lhs, group, column range) where ``expr`` is (or is a variable bound
        to) a matmul of a group's member weight; else None."""
        call = self.values.get(expr, expr) if isinstance(expr, relax.Var) else expr
        if not isinstance(call, relax.Call) or getattr(call.op, "name", "") != "relax.matmul":
            return None
        lhs, weight = call.args
        group = self.combined.get(lhs)
        if group is None or weight not in group.ranges:
            return None
        return call, lhs, group, group.ranges[weight]

    def visit_binding_block_(self, block):
        self.emitted = {}
        return super().visit_binding_block_(block)

    def visit_dataflow_block_(self, block):
        self.emitted = {}
        return super().visit_dataflow_block_(block)

    def _combined(self, lhs, group, biased: bool):
        """The group's combined matmul (``biased``: plus its bias), emitted once a block."""
        key = (group, biased)
        if key not in self.emitted:
            if biased:
                value = relax.op.add(self._combined(lhs, group, False), group.bias)
            else:
                value = relax.op.matmul(self.visit_expr(lhs), group.weight)
            self.emitted[key] = self.builder_.emit(value)
        return self.emitted[key]

    def _slice(self, lhs, group, columns, biased: bool):
        out = self._combined(lhs, group, biased)
        rank = len(static_shape(lhs))
        return relax.op.strided_slice(out, axes=[rank - 1], begin=[columns[0]],
                                      end=[columns[1]])

    def _rewrite(self, value):
        if not isinstance(value, relax.Call):
            return None
        name = getattr(value.op, "name", "")
        if name == "relax.matmul":
            member = self._member(value)
            return None if member is None else self._slice(*member[1:], biased=False)
        if name != "relax.add":
            return None
        for product, bias in (value.args, reversed(value.args)):
            member = self._member(product) if isinstance(bias, tvm.ir.GenericConst) else None
            if member is not None:
                call, lhs, group, columns = member
                if group.bias is not None and call in self.single_use:
                    return self._slice(lhs, group, columns, biased=True)
                return None  # the add stays; its matmul operand is rewritten on its own
        return None

    def visit_var_binding_(self, binding) -> None:
        new = self._rewrite(binding.value)
        if new is None:
            super().visit_var_binding_(binding)
            return
        output = self.builder_.current_block_is_dataflow() and \
            not isinstance(binding.var, relax.DataflowVar)
        emit = self.builder_.emit_output if output else self.builder_.emit
        self.set_var_remap(binding.var, emit(new, binding.var.name))


@tvm.transform.module_pass(opt_level=0, name="CombineProjections")
class CombineProjections:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        single_use = single_use_values(mod)
        mod = mod.clone()  # the caller's module must not change (passes get it itself)
        changed = False
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                new = combine_projections(mod, func, single_use)
                if not new.same_as(func):
                    mod[gv] = new
                    changed = True
        if not changed:
            return mod
        return relax.transform.DeadCodeElimination()(mod)  # the members' own matmuls
