"""Shared by the mutator-based passes: run a PyExprMutator over every Relax function of a
module, and ask whether any call in the module satisfies a predicate (to skip the rewrite,
and its re-normalization, when there is nothing to do)."""

from __future__ import annotations

from typing import Callable

import tvm
from tvm import relax


def mutate_functions(mod: tvm.IRModule, mutator: relax.PyExprMutator) -> tvm.IRModule:
    """The module with every Relax function replaced by ``mutator``'s rewrite of it (and any
    functions the mutator added through its builder)."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def any_expr(mod: tvm.IRModule, predicate: Callable[[relax.Expr], bool]) -> bool:
    """Whether some expression of some Relax function satisfies ``predicate``."""
    found = []

    def visit(expr):
        if not found and predicate(expr):
            found.append(expr)
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def mutate_if_any(mod: tvm.IRModule, predicate: Callable[[relax.Expr], bool],
                  make_mutator: Callable[[tvm.IRModule], relax.PyExprMutator]) -> tvm.IRModule:
    """``mutate_functions`` with ``make_mutator(mod)``, only when some expression satisfies
    ``predicate`` (else the module as it is: no re-normalization, no copy)."""
    if not any_expr(mod, predicate):
        return mod
    return mutate_functions(mod, make_mutator(mod))
