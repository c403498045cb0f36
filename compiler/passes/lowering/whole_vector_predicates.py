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
import tvm_ffi
from tvm import s_tir, tirx

from ...default_schedules.cpu_blocks import substitute, uses_var
from ...relax_walk import with_prim_funcs

_OPAQUE = tvm.transform.Sequential([s_tir.transform.LowerInitBlock(),
                                    s_tir.transform.ConvertBlocksToOpaque()])


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


def _guarded(loop) -> bool:
    """Whether ``loop`` is vectorized and its body a block with a guard."""
    return isinstance(loop, tirx.For) and loop.kind == tirx.ForKind.VECTORIZED and \
        isinstance(loop.body, s_tir.SBlockRealize) and \
        not (isinstance(loop.body.predicate, tirx.IntImm) and int(loop.body.predicate))


def _guard_split(loop: tirx.For):
    """(the guard of the last lane, the guard's lane-free part) of a vectorized loop whose
    block's predicate depends on the lane in a way _rises_with accepts; None otherwise."""
    realize = loop.body
    # one store, nothing the block defines (a buffer defined in both copies would be defined
    # twice)
    if not _guarded(loop) or realize.block.iter_vars or \
            not isinstance(realize.block.body, tirx.BufferStore) or realize.block.init or \
            realize.block.alloc_buffers or realize.block.match_buffers:
        return None
    var = loop.loop_var
    lane, free = [], []
    for term in _conjuncts(realize.predicate):
        (lane if uses_var(term, var) else free).append(term)
    if not lane or not all(_rises_with(term, var) for term in lane):
        return None
    last = loop.min + loop.extent - 1
    last_lane = tvm.sym.Analyzer().simplify(_all([substitute(t, var, last) for t in lane]))
    return last_lane, _all(free)


def _version(loop: tirx.For):
    """``loop`` versioned (the module docstring), or itself where _guard_split declines. The
    serial copy's loop and block get a fresh variable: one defined by two loops is not SSA."""
    split = _guard_split(loop)
    if split is None:
        return loop
    last_lane, free = split
    realize = loop.body
    vector = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind,
                      s_tir.SBlockRealize([], free, realize.block), loop.thread_binding,
                      loop.annotations)
    fresh = tirx.Var(loop.loop_var.name + "_lane", loop.loop_var.ty)
    serial = tirx.For(fresh, loop.min, loop.extent, tirx.ForKind.SERIAL,
                      substitute(realize, loop.loop_var, fresh), loop.thread_binding,
                      loop.annotations)
    return tirx.IfThenElse(last_lane, vector, serial)


def whole_vector_predicates(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a scheduled PrimFunc) with its lane-guarded vectorized loops versioned."""
    found: list = []
    tvm_ffi.structural_walk(func.body, (tirx.For, lambda loop: found.append(_guarded(loop))))
    if not any(found):
        return func
    opaque = _OPAQUE(tvm.IRModule({"main": func}))["main"]
    body = tvm_ffi.structural_map(opaque.body, (tirx.For, _version))
    return func if body.same_as(opaque.body) else opaque.with_body(body)


@tvm.transform.module_pass(opt_level=0, name="WholeVectorPredicates")
class WholeVectorPredicates:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return with_prim_funcs(mod, whole_vector_predicates)
