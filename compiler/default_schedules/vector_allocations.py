"""Which buffers a schedule would allocate inside a vectorized loop.

TVM 0.27 places each intermediate buffer at the innermost scope that holds all its uses
(PlanAndUpdateBufferAllocationLocation) and then vectorizes loops without widening what is
allocated inside them: every lane of such a loop reads and writes the same elements. A row
reduction computed under a loop over rows that was vectorized (an argmax, four rows a vector)
then gave every row the last lane's result, with no error. ApplyRulesSafely refuses such a
schedule, from a default rule or a tuning log, and takes the next one."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

_PLAN = tvm.transform.Sequential([s_tir.transform.LowerInitBlock(),
                                  s_tir.transform.PlanAndUpdateBufferAllocationLocation()])
_CHILDREN = ("body", "block", "then_case", "else_case")


def allocated_in_vectorized_loops(func: tirx.PrimFunc) -> list[str]:
    """Names of the buffers ``func`` (a scheduled PrimFunc) would allocate inside a vectorized
    loop, in the order found."""
    planned = _PLAN(tvm.IRModule({"main": func}))["main"]
    found: list[str] = []
    stack = [(planned.body, False)]
    while stack:
        node, vectorized = stack.pop()
        if vectorized and isinstance(node, s_tir.SBlock):
            found.extend(buffer.name for buffer in node.alloc_buffers)
        if isinstance(node, tirx.For) and node.kind == tirx.ForKind.VECTORIZED:
            vectorized = True
        children = list(node.seq) if isinstance(node, tirx.SeqStmt) else \
            [getattr(node, name, None) for name in _CHILDREN]
        stack.extend((child, vectorized) for child in reversed(children)
                     if isinstance(child, tirx.Stmt))
    return found
