"""Tuning tasks: one per distinct kernel of a compiled module, weighted by how often it runs.

Taken from the module compile produces just before its schedule phase (same passes, so the
keys match at compile time); identical kernels (same workload key) share one task. Kernels with
symbolic shapes are left out: they cannot be timed with one set of arguments."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import tvm
from tvm import relax

from .keys import workload_key


@dataclass
class Task:
    name: str
    key: str
    func: tvm.tirx.PrimFunc
    weight: int  # calls per model run, summed over identical kernels


def _call_counts(mod: tvm.IRModule) -> Counter:
    counts: Counter = Counter()

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            callee = expr.args[0]
            if isinstance(callee, tvm.ir.GlobalVar):
                counts[callee.name_hint] += 1
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


def static_shapes(func: tvm.tirx.PrimFunc) -> bool:
    return all(isinstance(d, tvm.tirx.IntImm) for param in func.params
               for d in getattr(param.ty, "shape", []))


def extract_tasks(mod: tvm.IRModule) -> list[Task]:
    calls = _call_counts(mod)
    tasks: dict[str, Task] = {}
    for gv, func in sorted(mod.functions_items(), key=lambda item: item[0].name_hint):
        if not isinstance(func, tvm.tirx.PrimFunc) or not static_shapes(func):
            continue
        key = workload_key(func)
        weight = max(1, calls.get(gv.name_hint, 0))
        if key in tasks:
            tasks[key].weight += weight
        else:
            tasks[key] = Task(gv.name_hint, key, func, weight)
    return list(tasks.values())
