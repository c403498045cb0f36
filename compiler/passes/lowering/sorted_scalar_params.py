"""SortScalarParams: a kernel's scalar parameters (the symbolic dims it reads as values) in
the order of their names, and every call passing them in that order.

Why: TVM's ``call_te`` (relax/utils.py, which LegalizeOps' converters call) makes the dims a
kernel uses but cannot read from a tensor shape into parameters in the order of a Python
``set`` of TIR vars, and a TIR var hashes by its address. A decoder's ``take`` over
``past_sequence_length + sequence_length`` took the two dims in either order depending on the
process: the same model compiled to different bytes, and a tuning record for such a kernel
(keyed by the kernel's structure) matched only the builds that happened to share its order.

FuseTIR does the same for the dims of the kernels it fuses (an attention kernel over
``past_len`` and ``seq`` took them in either order).

How: after LegalizeOps and again after FuseTIR, for each PrimFunc that only ``call_tir``
calls (one argument tuple form for every call), the scalar parameters among those the tuple
binds are sorted by name in the positions they held, and each call's tuple is permuted the
same way. A kernel whose scalars share a name, that is referenced any other way, or that has
a ``global_symbol`` (its signature is then an interface others may call) is left as it is.
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax, tirx

from ...relax_walk import is_scalar, mutate_functions, visit_functions

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def permutation(func: tirx.PrimFunc, bound: int) -> list[int] | None:
    """The new order of ``func``'s first ``bound`` parameters (scalars sorted by name in their
    own positions), or None when nothing moves or names repeat."""
    params = list(func.params)[:bound]
    positions = [k for k, p in enumerate(params) if is_scalar(p)]
    names = [params[k].name for k in positions]
    if len(positions) < 2 or len(set(names)) != len(names) or names == sorted(names):
        return None
    order = list(range(len(params)))
    for position, source in zip(positions, sorted(positions, key=lambda k: params[k].name)):
        order[position] = source
    return order


def _plans(mod: tvm.IRModule) -> dict[str, list[int]]:
    """Kernel name -> new order of its call tuple, for the kernels that can be reordered."""
    references: Counter = Counter()  # every mention of a function's name
    calls: Counter = Counter()  # mentions as the kernel of a call_tir
    tuple_sizes: dict[str, set] = {}

    def visit(expr):
        if isinstance(expr, tvm.ir.GlobalVar):
            references[expr.name_hint] += 1
        elif isinstance(expr, relax.Call) and expr.op == _CALL_TIR:
            name = expr.args[0].name_hint
            calls[name] += 1
            args = expr.args[1]
            tuple_sizes.setdefault(name, set()).add(
                len(args.fields) if isinstance(args, relax.Tuple) else None)
    visit_functions(mod, visit)
    plans = {}
    for gvar, func in mod.functions_items():
        name = gvar.name_hint
        sizes = tuple_sizes.get(name, set())
        if not isinstance(func, tirx.PrimFunc) or len(sizes) != 1 or None in sizes or \
                references[name] != calls[name] or "global_symbol" in (func.attrs or {}):
            continue
        order = permutation(func, next(iter(sizes)))
        if order is not None:
            plans[name] = order
    return plans


@relax.expr_functor.mutator
class _Reorder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, plans: dict[str, list[int]]):
        super().__init__(mod)
        self.plans = plans

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if call.op != _CALL_TIR or call.args[0].name_hint not in self.plans:
            return call
        fields = list(call.args[1].fields)
        ordered = relax.Tuple([fields[k] for k in self.plans[call.args[0].name_hint]])
        return relax.Call(call.op, [call.args[0], ordered, *call.args[2:]], call.attrs,
                          call.ty_args, call.span)


@tvm.transform.module_pass(opt_level=0, name="SortScalarParams")
class SortScalarParams:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        plans = _plans(mod)
        if not plans:
            return mod
        out = mutate_functions(mod, _Reorder(mod, plans))  # a new module: edited in place
        for name, order in plans.items():
            func = out[name]
            params = list(func.params)
            params[:len(order)] = [params[k] for k in order]
            out[name] = tirx.PrimFunc(params, func.body, func.ret_type, func.attrs, func.span)
        return out
