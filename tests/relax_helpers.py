"""Helpers for the pass tests: the Relax ops a module's ``main`` calls, in order."""

import tvm
from tvm import relax


def main_ops(mod: tvm.IRModule) -> list[str]:
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return names
