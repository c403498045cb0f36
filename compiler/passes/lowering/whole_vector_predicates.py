"""WholeVectorPredicates: a vectorized loop whose block is guarded per lane runs as whole
vectors wherever every lane passes the guard.

Why: a block predicate that depends on the vectorized loop's variable (the crop of a packed
kernel whose output columns end inside its last vector: ``c0 + lane < 50257``) makes TVM's
VectorizeLoop scalarize the whole loop, in every tile, although only the last column tile
of a row holds a lane that fails it. A packed matmul's crop is then a scalar load, add and
store per output element after each tile (GPT-2's vocabulary head, and every matmul whose
columns PrepackWeights pads to a better register tile: dot_kernels.packed_blocks).

How: each such loop becomes ``if guard(last lane): the loop vectorized, without the lane's
part of the guard; else: the loop as it was, serial``. That holds where each lane-dependent
part of the guard is ``a < b`` or ``a <= b`` with ``a - b`` linear in the lane with a
non-negative coefficient: if the last lane passes, every lane does. Other guards are left as
they are.

Where: after the schedule rules (the schedule phase's last steps), on the scheduled kernels.
The two copies of the block need blocks without iteration variables of their own, so a
kernel that has such a loop is first put in the form TVM's lowering gives it first anyway
(LowerInitBlock, ConvertBlocksToOpaque); other kernels are left untouched."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ...relax_walk import with_functions

_OPAQUE = tvm.transform.Sequential([s_tir.transform.LowerInitBlock(),
                                    s_tir.transform.ConvertBlocksToOpaque()])


def _substitute(expr, var, value):
    """``expr`` with ``var`` replaced by ``value``."""
    return tirx.IndexMap([var], [expr], None).map_indices([value])[0]


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr, []))


def _conjuncts(expr) -> list:
    if isinstance(expr, tirx.And):
        return _conjuncts(expr.a) + _conjuncts(expr.b)
    return [expr]


def _all(terms: list):
    """The conjunction of ``terms`` (true for none)."""
    if not terms:
        return tirx.const(True, "bool")
    result = terms[0]
    for term in terms[1:]:
        result = tirx.And(result, term)
    return result


def _rises_with(cond, var) -> bool:
    """Whether ``cond`` is ``a < b`` or ``a <= b`` with ``a - b`` linear in ``var`` with a
    non-negative constant coefficient: true at the loop's last value, it is true at every
    earlier one."""
    if not isinstance(cond, (tirx.LT, tirx.LE)):
        return False
    linear = tvm.sym.detect_linear_equation(cond.a - cond.b, [var])
    return len(linear) == 2 and isinstance(linear[0], tirx.IntImm) and int(linear[0]) >= 0


def _guard_split(loop: tirx.For):
    """(the guard of the last lane, the guard's lane-free part) of a vectorized loop whose
    block's predicate depends on the lane in a way _rises_with accepts; None otherwise."""
    realize = loop.body
    # one store, nothing the block defines (a buffer defined in both copies would be defined
    # twice)
    if not isinstance(realize, s_tir.SBlockRealize) or realize.block.iter_vars or \
            not isinstance(realize.block.body, tirx.BufferStore) or realize.block.init or \
            realize.block.alloc_buffers or realize.block.match_buffers:
        return None
    var = loop.loop_var
    lane, free = [], []
    for term in _conjuncts(realize.predicate):
        (lane if _uses(term, var) else free).append(term)
    if not lane or not all(_rises_with(term, var) for term in lane):
        return None
    last = loop.min + loop.extent - 1
    return _all([_substitute(term, var, last) for term in lane]), _all(free)


def _region(region, var, value):
    return tvm.ir.TensorRegion(region.source, [
        tvm.ir.Range.from_min_extent(_substitute(r.min, var, value),
                                     _substitute(r.extent, var, value))
        for r in region.region], region.ty)


def _serial_copy(loop: tirx.For) -> tirx.For:
    """``loop`` as a serial loop of a fresh variable (its block copied with it)."""
    var = loop.loop_var
    fresh = tirx.Var(var.name + "_lane", var.ty)
    realize = loop.body
    block = realize.block
    store = block.body
    body = tirx.BufferStore(store.buffer, _substitute(store.value, var, fresh),
                            [_substitute(i, var, fresh) for i in store.indices])
    copy = s_tir.SBlock([], [_region(r, var, fresh) for r in block.reads],
                        [_region(r, var, fresh) for r in block.writes], block.name_hint,
                        body, None, [], [], block.annotations)
    return tirx.For(fresh, loop.min, loop.extent, tirx.ForKind.SERIAL,
                    s_tir.SBlockRealize([], _substitute(realize.predicate, var, fresh), copy),
                    loop.thread_binding, loop.annotations)


def _version(loop: tirx.For):
    """``loop`` versioned (the module docstring), or itself where _guard_split declines."""
    split = _guard_split(loop)
    if split is None:
        return loop
    last_lane, free = split
    realize = loop.body
    vector = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                      s_tir.SBlockRealize([], free, realize.block), loop.thread_binding,
                      loop.annotations)
    return tirx.IfThenElse(last_lane, vector, _serial_copy(loop))


def _rewrite(stmt):
    """``stmt`` with each guarded vectorized loop under it versioned (_version)."""
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_rewrite(s) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    if isinstance(stmt, tirx.For):
        body = _rewrite(stmt.body)
        if not body.same_as(stmt.body):
            stmt = tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                            stmt.thread_binding, stmt.annotations)
        return _version(stmt) if stmt.kind == tirx.ForKind.VECTORIZED else stmt
    if isinstance(stmt, tirx.IfThenElse):
        then = _rewrite(stmt.then_case)
        other = _rewrite(stmt.else_case) if stmt.else_case is not None else None
        if then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case)):
            return stmt
        return tirx.IfThenElse(stmt.condition, then, other)
    if isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        body = _rewrite(block.body)
        if body.same_as(block.body):
            return stmt
        block = s_tir.SBlock(list(block.iter_vars), list(block.reads), list(block.writes),
                             block.name_hint, body, block.init, list(block.alloc_buffers),
                             list(block.match_buffers), block.annotations)
        return s_tir.SBlockRealize(list(stmt.iter_values), stmt.predicate, block)
    return stmt


def _has_guarded_vector_loop(stmt) -> bool:
    """Whether a vectorized loop under ``stmt`` has a guarded block as its body."""
    if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.VECTORIZED and \
            isinstance(stmt.body, s_tir.SBlockRealize) and \
            not (isinstance(stmt.body.predicate, tirx.IntImm) and int(stmt.body.predicate)):
        return True
    children = list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else \
        [getattr(stmt, name, None) for name in ("body", "then_case", "else_case", "block")]
    return any(_has_guarded_vector_loop(child) for child in children
               if isinstance(child, (tirx.Stmt, s_tir.SBlock)))


def whole_vector_predicates(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a scheduled PrimFunc) with its lane-guarded vectorized loops versioned."""
    if not _has_guarded_vector_loop(func.body):
        return func
    opaque = _OPAQUE(tvm.IRModule({"main": func}))["main"]
    body = _rewrite(opaque.body)
    return func if body.same_as(opaque.body) else opaque.with_body(body)


@tvm.transform.module_pass(opt_level=0, name="WholeVectorPredicates")
class WholeVectorPredicates:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        changed = {}
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                new = whole_vector_predicates(func)
                if not new.same_as(func):
                    changed[gvar] = new
        return with_functions(mod, changed)
