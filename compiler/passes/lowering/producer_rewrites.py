"""What PaddedRowsInProducer and PaddedImageInProducer share: reading a ``call_tir`` apart,
the root block of a scheduled kernel and a copy of it with parts replaced, a kernel's
renamed copy, and the loop nest that stores one value into a box of a buffer (the rows or
border that the pad kernel wrote before)."""

from __future__ import annotations

import tvm
from tvm import relax, s_tir, tirx


def call_tir_parts(expr):
    """(global var, arguments) of a plain ``call_tir`` (no shape arguments), else None."""
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op) or \
            expr.op.name != "relax.call_tir" or len(expr.args) != 2 or \
            not isinstance(expr.args[1], relax.Tuple):
        return None
    return expr.args[0], list(expr.args[1].fields)


def static_buffer_shape(buffer) -> list[int] | None:
    """A TIR buffer's shape when every dim is a constant, else None."""
    shape = buffer.ty.shape
    if not all(isinstance(d, tirx.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]


def with_shape(buffer, shape: list[int], dtype: str):
    """A new buffer variable of ``buffer``'s name and type but ``shape`` (dims of type
    ``dtype``)."""
    t = buffer.ty
    return tirx.Var(buffer.name, tirx.BufferType(
        t.dtype, t.storage_scope, [tirx.const(e, dtype) for e in shape], t.strides,
        t.elem_offset, t.data_alignment, t.offset_factor, t.layout, t.allocated_addr))


def root_block(func: tirx.PrimFunc):
    """The block at the root of a scheduled kernel's body, or None where there is none."""
    body = func.body
    if isinstance(body, s_tir.SBlockRealize) and not body.iter_values:
        return body.block
    return None


def statements(stmt: tirx.Stmt) -> list:
    """The statements of a sequence, or the one statement."""
    return list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else [stmt]


def sequence(stmts: list) -> tirx.Stmt:
    """``stmts`` as one statement (TVM refuses a sequence of one)."""
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def with_root_block(func: tirx.PrimFunc, params: list | None = None, body: list | None = None,
                    alloc_buffers: list | None = None, match_buffers: list | None = None
                    ) -> tirx.PrimFunc:
    """``func`` (with a root block) with its parameters, or its root block's statements,
    allocations or match buffers, replaced by those given."""
    root = root_block(func)
    block = s_tir.SBlock(
        root.iter_vars, root.reads, root.writes, root.name_hint,
        root.body if body is None else sequence(body), root.init,
        root.alloc_buffers if alloc_buffers is None else alloc_buffers,
        root.match_buffers if match_buffers is None else match_buffers, root.annotations)
    return tirx.PrimFunc(func.params if params is None else params,
                         s_tir.SBlockRealize([], True, block), func.ret_type, func.attrs)


def renamed(func: tirx.PrimFunc, name: str) -> tirx.PrimFunc:
    """``func`` under the symbol ``name`` where it has one (a private kernel has none)."""
    if func.attrs is not None and "global_symbol" in func.attrs:
        return func.with_attr("global_symbol", name)
    return func


def fill(out, lows: list[int], extents: list[int], value, dtype: str, name: str,
         prefix: str) -> tirx.Stmt:
    """A loop nest (loops ``<prefix>k``, one block ``name``) that stores ``value`` into the box
    of ``out`` from ``lows`` of ``extents`` (indices of type ``dtype``, as its shape's)."""
    loops = [tirx.Var(f"{prefix}{k}", dtype) for k in range(len(lows))]
    iters = [tirx.IterVar(tvm.ir.Range.from_min_extent(tirx.const(0, dtype),
                                                       tirx.const(e, dtype)),
                          tirx.Var(f"v_{prefix}{k}", dtype), 0) for k, e in enumerate(extents)]
    index = [it.var + tirx.const(low, dtype) for it, low in zip(iters, lows)]
    block = s_tir.SBlock(iters, [], [out[tuple(slice(i, i + 1) for i in index)]], name,
                         tirx.BufferStore(out, tirx.const(value, out.ty.dtype), index))
    stmt: tirx.Stmt = s_tir.SBlockRealize(loops, True, block)
    for var, extent in reversed(list(zip(loops, extents))):
        stmt = tirx.For(var, tirx.const(0, dtype), tirx.const(extent, dtype),
                        tirx.ForKind.SERIAL, stmt)
    return stmt
