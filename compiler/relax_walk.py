"""Shared by the mutator-based passes and the compile reports: run a PyExprMutator over every
Relax function of a module, visit or collect their expressions, and ask whether any call in
the module satisfies a predicate (to skip a rewrite, and its re-normalization, when there is
nothing to do)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax


def mutate_functions(mod: tvm.IRModule, mutator: relax.PyExprMutator) -> tvm.IRModule:
    """The module with every Relax function replaced by ``mutator``'s rewrite of it (and any
    functions the mutator added through its builder)."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


class RewriteWhenEnabled:
    """The body of a module pass that runs the mutator ``rewriter(mod)`` makes over a module
    with a ``main``, and only when ``enabled`` (say, int8 sites were annotated). Subclass, set
    ``rewriter`` (a staticmethod) and decorate with tvm.transform.module_pass."""

    rewriter: Callable[[tvm.IRModule], relax.PyExprMutator] = None

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not self.enabled or not has_main(mod):
            return mod
        return mutate_functions(mod, self.rewriter(mod))


def visit_functions(mod: tvm.IRModule, visit: Callable[[relax.Expr], None]) -> None:
    """Call ``visit`` on every expression of every Relax function, in post order."""
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)


def op_calls(mod: tvm.IRModule) -> list[relax.Call]:
    """Every call of a Relax operator (not of a function) in every Relax function."""
    calls: list[relax.Call] = []
    visit_functions(mod, lambda expr: calls.append(expr) if isinstance(expr, relax.Call)
                    and isinstance(expr.op, tvm.ir.Op) else None)
    return calls


def any_expr(mod: tvm.IRModule, predicate: Callable[[relax.Expr], bool]) -> bool:
    """Whether some expression of some Relax function satisfies ``predicate``."""
    found = []

    def visit(expr):
        if not found and predicate(expr):
            found.append(expr)
    visit_functions(mod, visit)
    return bool(found)


def mutate_if_any(mod: tvm.IRModule, predicate: Callable[[relax.Expr], bool],
                  make_mutator: Callable[[tvm.IRModule], relax.PyExprMutator]) -> tvm.IRModule:
    """``mutate_functions`` with ``make_mutator(mod)``, only when some expression satisfies
    ``predicate`` (else the module as it is: no re-normalization, no copy)."""
    if not any_expr(mod, predicate):
        return mod
    return mutate_functions(mod, make_mutator(mod))


def with_functions(mod: tvm.IRModule, replacements: dict) -> tvm.IRModule:
    """A new module with the functions of ``replacements`` (GlobalVar or name -> function) in
    place of ``mod``'s, its attributes kept; ``mod`` itself when there are none (a Python
    module pass gets the caller's module: it is never edited)."""
    if not replacements:
        return mod
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for key, func in replacements.items():
        out[key] = func
    return out


def with_prim_funcs(mod: tvm.IRModule, rewrite: Callable, where: Callable = lambda _gv: True
                    ) -> tvm.IRModule:
    """``mod`` with each PrimFunc whose global var ``where`` accepts replaced by
    ``rewrite(func)`` (with_functions: ``mod`` itself when none changes)."""
    changed = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and where(gv):
            new = rewrite(func)
            if not new.same_as(func):
                changed[gv] = new
    return with_functions(mod, changed)


def is_scalar(value) -> bool:
    """Whether a Relax expression or a PrimFunc parameter has a PrimType (a scalar, such as a
    symbolic dim passed by value), not a tensor or buffer."""
    return type(value.ty).__name__ == "PrimType"


def op_name(expr) -> str | None:
    """The Relax operator ``expr`` calls ("relax.add"), or None for anything else."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def has_main(mod: tvm.IRModule) -> bool:
    """Whether the module has a ``main`` (the passes over the model's graph work on it)."""
    return "main" in [gv.name_hint for gv in mod.get_global_vars()]


def main_dataflow_blocks(mod: tvm.IRModule) -> list[relax.DataflowBlock]:
    """The dataflow blocks of the module's ``main`` (none without a ``main``)."""
    if not has_main(mod):
        return []
    return [b for b in getattr(mod["main"].body, "blocks", [])
            if isinstance(b, relax.DataflowBlock)]


def single_use_values(mod: tvm.IRModule) -> set:
    """Values bound to dataflow variables that exactly one binding reads (outputs excluded)."""
    return {value for value, count in value_uses(mod).items() if count == 1}


def value_uses(mod: tvm.IRModule) -> dict:
    """Values bound to dataflow variables -> how many bindings read them (outputs
    excluded)."""
    uses = {}
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        values = relax.analysis.get_var2val(func)
        for block in getattr(func.body, "blocks", []):
            if not isinstance(block, relax.DataflowBlock):
                continue
            for var, users in relax.analysis.udchain(block).items():
                if isinstance(var, relax.DataflowVar) and var in values:
                    uses[values[var]] = len(users)
    return uses


def constant_values(expr) -> np.ndarray | None:
    """A constant's values as float64 (a tensor constant, or a prim value such as clip's
    bounds), or None for anything else."""
    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    value = getattr(expr, "value", None)
    if isinstance(value, (int, float)):
        return np.asarray(float(value))
    return value.numpy().astype(np.float64) if hasattr(value, "numpy") else None


def one_value(expr) -> float | None:
    """The number of a constant whose elements are one number (a scalar, [1], [1, 1, ...], a
    prim value), or None."""
    values = constant_values(expr)
    return float(values.reshape(-1)[0]) if values is not None and values.size == 1 else None
