"""Shared by the pattern-based passes: apply one dataflow-pattern rewrite to every Relax
function of a module, then drop the bindings it left unused."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import rewrite_call


def rewrite_module(mod: tvm.IRModule, pattern, rewriter,
                   new_functions: dict | None = None) -> tvm.IRModule:
    """``new_functions`` (GlobalVar -> function) is filled by the rewriter with the kernels its
    rewrites call; they are added to the module."""
    updates = {gv: rewrite_call(pattern, rewriter, func)
               for gv, func in mod.functions_items() if isinstance(func, relax.Function)}
    mod = mod.clone()  # a Python module pass gets the caller's module itself: never edit it
    for gv, func in {**updates, **(new_functions or {})}.items():
        mod[gv] = func
    return relax.transform.DeadCodeElimination()(mod)
