"""OrderShapeFuncStores: the stores of each ``shape_func`` in the order of their heap slot.

Why: TVM's VMShapeLower writes a ``shape_func`` for the symbolic dims that become computable
at once (``4 * n * s``, ``(s + 15) // 16 * 16``, ...), one store into the shape heap per
expression. It lists them by iterating an ``unordered_map`` keyed by the expressions'
structural hash, and the hash of a free ``tirx.Var`` is its address: the order changes from
run to run, and with it the bytes of the ``.so``. A model with symbolic dims then built a
different library each time from the same input.

How: after VMShapeLower, each PrimFunc it added (named ``shape_func*``) whose body is a
sequence of stores into the heap at constant indices gets its stores sorted by index. The
pass checks that the stores are independent (no store reads a slot another one writes: each
reads only dims matched before the call), so any order computes the same heap.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ...relax_walk import with_prim_funcs


def _heap_index(node) -> int | None:
    """The constant index of a one-index BufferStore or BufferLoad, else None."""
    if not isinstance(node, (tirx.BufferStore, tvm.ir.TensorLoad)) or len(node.indices) != 1:
        return None
    index = node.indices[0]
    return int(index.value) if isinstance(index, tirx.IntImm) else None


_BINARY = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod,
           tirx.Min, tirx.Max, tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.And,
           tirx.Or)


def _reads(expr) -> list | None:
    """The heap indices ``expr`` loads, or None when it holds anything but integer
    arithmetic over constant-index loads (TVM 0.27's Python has no TIR visitor; what this
    walk does not know, it does not vouch for)."""
    if isinstance(expr, (tirx.IntImm, tirx.Var)):
        return []
    if isinstance(expr, tvm.ir.TensorLoad):
        index = _heap_index(expr)
        return [index] if index is not None else None
    if isinstance(expr, _BINARY):
        parts = [_reads(expr.a), _reads(expr.b)]
    elif isinstance(expr, (tirx.Cast, tirx.Not)):
        parts = [_reads(expr.value if isinstance(expr, tirx.Cast) else expr.a)]
    elif isinstance(expr, tirx.Select):
        parts = [_reads(expr.condition), _reads(expr.true_value), _reads(expr.false_value)]
    else:
        return None
    return None if None in parts else [i for part in parts for i in part]


def ordered(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its stores sorted by heap index, or ``func`` itself unless its body is a
    sequence of stores into one buffer at distinct constant indices, none of which another
    store of the sequence reads (then their order cannot matter)."""
    body = func.body
    if not isinstance(body, tirx.SeqStmt):
        return func
    stores = list(body.seq)
    indices = [_heap_index(s) for s in stores]
    if None in indices or len(set(indices)) != len(indices) or \
            not all(s.buffer.same_as(stores[0].buffer) for s in stores):
        return func
    reads = [_reads(s.value) for s in stores]
    if None in reads or set(indices) & {i for r in reads for i in r}:
        return func
    if indices == sorted(indices):
        return func
    order = sorted(range(len(stores)), key=indices.__getitem__)
    return func.with_body(tirx.SeqStmt([stores[k] for k in order]))


@tvm.transform.module_pass(opt_level=0, name="OrderShapeFuncStores")
class OrderShapeFuncStores:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return with_prim_funcs(mod, ordered, lambda gv: gv.name_hint.startswith("shape_func"))
