"""Shared by the default CPU rules: the target's vector width, loop arithmetic, and the
generic schedule of one injective block (parallel outer loops, vectorized inner loop)."""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.sym.analyzer import Analyzer
from tvm.target import Target

from aotc.targets import simd

from ..symbolic_padding import multiple_of

_MAX_ROW_BLOCK = 8
# Parallel loops shorter than this are not worth a thread-pool launch.
_MIN_PARALLEL_EXTENT = 2
# Loop nests of fewer scalar iterations than this run on the calling thread: a launch on
# TVM's pool (waking or joining its workers) costs more than splitting so little work saves,
# and it is what collapses beside a busy neighbour. bench/parallel_grain.py measures where a
# parallel elementwise loop starts to pay (docs/design/measurements.md, cpu_blocks.py).
MIN_PARALLEL_WORK = 4096


def vector_lanes(target: Target, dtype_bits: int = 32) -> int:
    """Lanes of one SIMD register for the target (16 fp32 on AVX-512, 8 on AVX2, 4 on NEON)."""
    return max(1, simd(target)[0] // dtype_bits)


def accumulator_vectors(target: Target) -> int:
    """SIMD registers a register tile may hold as accumulators: three quarters of them (24 of
    AVX-512's and NEON's 32, 12 of AVX2's 16), the rest free for the broadcast input and the
    weight vectors."""
    return simd(target)[1] * 3 // 4


def _largest_divisor(extent: int, limit: int, multiple_of: int = 1) -> int:
    """Largest divisor of ``extent`` that is <= limit, preferring multiples of ``multiple_of``."""
    divisors = [d for d in range(1, min(extent, limit) + 1) if extent % d == 0]
    preferred = [d for d in divisors if d % multiple_of == 0]
    return max(preferred or divisors)


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    return _int(sch.get(loop).extent)


def _int(expr) -> int | None:
    """A static integer's value; None for a symbolic expression."""
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def uses_var(expr, var) -> bool:
    """Whether ``expr`` reads the variable ``var``."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr, []))


def substitute(node, var, value):
    """``node`` (a TIR expression or statement) with the variable ``var`` replaced by
    ``value``."""
    return tvm_ffi.structural_map(node, (tirx.Var, lambda v: value if v.same_as(var) else v))


def renew_definitions(node, replacements: dict | None = None):
    """``node`` (TIR) with a new variable for each one it defines, so that the copy can stand
    beside the original in one module; a defined variable in ``replacements`` (old -> new)
    becomes that one instead."""
    fresh: dict = {}
    replacements = replacements or {}

    def renewed(var, kind):
        if kind != tvm_ffi.structural.DefRegionKind.NONE:
            new = replacements.get(var)
            fresh[var] = tirx.Var(var.name, var.ty) if new is None else new
            return fresh[var]
        return fresh.get(var, var)
    return tvm_ffi.structural_map(node, with_def_region_kind=(tirx.Var, renewed))


def divisible(sch: s_tir.Schedule, loop, factor: int) -> bool:
    """Whether the loop's extent is provably a multiple of ``factor``: a static one, or a
    symbolic one padded to it (``(n + 15) // 16 * 16``)."""
    return multiple_of(sch.get(loop).extent, factor)


def transposed_read_axis(sch: s_tir.Schedule, block) -> int | None:
    """For a block at root whose innermost loop reads its largest input with a stride (a
    transpose: Kt of an attention head, NCHW <-> NHWC), the innermost other loop that reads it
    contiguously, or None. schedule_injective_block then moves the outer part of the
    vectorized loop above that one: a vector gathers one element from each of ``lanes`` rows
    of the input, and with the contiguous loop outside, the next vector that uses those rows'
    cache lines comes only after the whole vectorized loop, when a long one (Whisper's 1,500
    tokens) has evicted them; inside, the lines of a tile of rows are read once each.
    Strides are those at the origin (index 0 on every axis): a reshape's division and modulo
    make them vary elsewhere, which only makes the loop order less good, never wrong."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    variables = [iv.var for iv in stmt.iter_vars]
    if len(variables) != len(loops) or len(variables) < 2 or any(
            _extent(sch, loop) != _int(iv.dom.extent) for loop, iv in zip(loops, stmt.iter_vars)):
        return None  # not the loops' own axes, in order
    reads = [r for r in stmt.reads if all(isinstance(d, tirx.IntImm) for d in r.source.shape)
             and all(_int(rng.extent) == 1 for rng in r.region)]
    if not reads:
        return None
    read = max(reads, key=lambda r: math.prod(int(d) for d in r.source.shape))
    offset, stride = tirx.const(0, "int64"), 1
    for rng, dim in zip(reversed(read.region), reversed(read.source.shape)):
        offset = offset + tirx.Cast("int64", rng.min) * stride
        stride *= int(dim)

    def at(one: int | None) -> int | None:
        """The offset read with axis ``one`` at 1 and the others at 0."""
        analyzer = Analyzer()
        for k, var in enumerate(variables):
            analyzer.bind(var, tirx.const(int(k == one), str(var.ty)))
        return _int(analyzer.simplify(offset))

    origin = at(None)
    steps = [at(k) for k in range(len(variables))]
    if origin is None or any(step is None for step in steps):
        return None
    strides = [step - origin for step in steps]
    if abs(strides[-1]) <= 1:
        return None
    contiguous = [k for k in range(len(strides) - 1)
                  if strides[k] == 1 and _extent(sch, loops[k]) != 1]
    return contiguous[-1] if contiguous else None


# Elementwise loops go up to this many vectors a step (schedule_injective_block, and
# cpu_rows.schedule_injective_tail for the passes over a row): LLVM splits each operation of
# the wide vector into register-wide ones side by side, so the vectors' dependency chains
# interleave. With one vector a step, an exp's chain (about 25 dependent operations) is
# emitted whole, and a core whose out-of-order window holds about one such chain (AVX2 CPUs
# that split 256-bit operations in two) waits on its latency: the one-kernel attention's
# softmax did.
WIDE_VECTORS = 4


def schedule_injective_block(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Parallelize the outer spatial loops of a block at root and vectorize its inner loop."""
    loops = sch.get_loops(block)
    iter_kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    if len(iter_kinds) != len(loops):
        return
    n_spatial = 0
    for kind in iter_kinds:
        if kind != tirx.IterVar.DataPar:
            break
        n_spatial += 1
    if n_spatial == 0:
        return
    all_spatial = n_spatial == len(loops)
    if all_spatial and not touches_bool(sch, block):
        inner_ext = _extent(sch, loops[-1])
        if inner_ext and inner_ext >= 4 and len(loops) > 1:
            factor = _largest_divisor(inner_ext, lanes * WIDE_VECTORS, lanes)
            if guarded_load(sch, block):
                factor = _power_of_two_divisor(inner_ext, lanes * WIDE_VECTORS)
            if factor > 1:
                contiguous = transposed_read_axis(sch, block)
                outer, inner = sch.split(loops[-1], factors=[None, factor])
                if contiguous is not None:
                    sch.reorder(outer, *loops[contiguous:-1])
                sch.vectorize(inner)
                loops = sch.get_loops(block)[:-1]
                n_spatial = len(loops)
    outer = sch.fuse(*loops[:n_spatial]) if n_spatial > 1 else loops[0]
    ext = _extent(sch, outer)
    if (ext is None or ext >= _MIN_PARALLEL_EXTENT) and parallel_pays(sch, block):
        sch.parallel(outer)


def loop_nest_work(sch: s_tir.Schedule, block) -> int | None:
    """Scalar iterations of the loops around ``block`` (None when one is symbolic)."""
    total = 1
    for loop in sch.get_loops(block):
        ext = _extent(sch, loop)
        if ext is None:
            return None
        total *= ext
    return total


def worth_parallel(work: int | None) -> bool:
    """Whether a loop nest of ``work`` iterations goes to the thread pool; symbolic sizes do
    (they are the large ones: sequence lengths, batches)."""
    return work is None or work >= MIN_PARALLEL_WORK


def parallel_pays(sch: s_tir.Schedule, block) -> bool:
    """Whether the loops around ``block`` go to the thread pool (worth_parallel)."""
    return worth_parallel(loop_nest_work(sch, block))


def _power_of_two_divisor(extent: int, limit: int) -> int:
    """The largest power of two that divides ``extent``, at most ``limit``."""
    factor = 1
    while extent % (2 * factor) == 0 and 2 * factor <= limit:
        factor *= 2
    return factor


def guarded_load(sch, block) -> bool:
    """Whether the block's value reads under an ``if_then_else`` (a zero-padded copy: the read
    is made only inside the bounds). LLVM scalarizes such a vector of a length that is not a
    power of two (a pixel's 96 channels of uint16: a <96 x i16> load under a branch is one
    vpinsrw per lane), so those blocks take power-of-two vectors."""
    value = getattr(sch.get(block).body, "value", None)
    return value is not None and "prim.if_then_else" in _called_ops(value)


def touches_bool(sch, block) -> bool:
    """Whether the block must stay scalar. Blocks reading or writing bool buffers: TVM 0.27's
    LLVM codegen gets vectors of bool wrong (a vectorized ``logical_not(x > 0)`` came out all
    True - a silent wrong answer in torch's _safe_softmax and any masking code - and
    vectorized bool and/or failed in LLVM's verifier). Blocks calling sinh or cosh: TVM has
    no vector lowering for them ("unknown intrinsic tirx.sinh" at codegen; every other unary
    intrinsic was checked and has one)."""
    stmt = sch.get(block)
    regions = list(stmt.reads) + list(stmt.writes)
    if any(str(region.source.dtype) == "bool" for region in regions):
        return True
    value = getattr(stmt.body, "value", None)
    return value is not None and bool(_called_ops(value) & _SCALAR_ONLY_INTRINSICS)


_SCALAR_ONLY_INTRINSICS = {"tirx.sinh", "tirx.cosh"}


def expression_size(expr, loads_of=None) -> tuple[int, int]:
    """(nodes in ``expr``, loads in it from the buffer ``loads_of``). Inlining a producer
    multiplies its expression by the number of times its reader loads it, so chains of
    inlined blocks can grow geometrically."""
    nodes = loads = 0
    for node in subexpressions(expr):
        nodes += 1
        if (loads_of is not None and isinstance(node, tvm.ir.TensorLoad)
                and node.source.same_as(loads_of)):
            loads += 1
    return nodes, loads


# An inlined expression no larger than this. A chain of 8 sigmoids (vector_math's, which reads
# its input several times) and multiply-adds fused into one kernel grew past 10^5 nodes when
# every block was inlined: 25 s to compile; 10 such layers took 560 s and 9 GB, and 45 were
# killed for memory; after a conv (its epilogue), 10 layers ran past 100 s. Real models'
# inlined chains stay far below (EfficientNet's hardswish: ~60 nodes).
MAX_INLINED_NODES = 2000


def small_enough_to_inline(sch: s_tir.Schedule, block, into=None) -> bool:
    """Whether the readers of ``block`` (or just ``into``, for reverse_compute_inline) stay
    under MAX_INLINED_NODES with its expression substituted for their loads of it."""
    producer = sch.get(block)
    if not hasattr(producer.body, "value") or len(producer.writes) != 1:
        return True  # not a plain computation: the inline primitives refuse it anyway
    inner, _ = expression_size(producer.body.value)
    for consumer in [into] if into is not None else sch.get_consumers(block):
        body = sch.get(consumer).body
        if not hasattr(body, "value"):
            continue
        outer, loads = expression_size(body.value, producer.writes[0].source)
        if outer + loads * (inner - 1) > MAX_INLINED_NODES:
            return False
    return True


def _called_ops(expr) -> set[str]:
    """Names of the intrinsics an expression calls."""
    return {str(node.op.name) if hasattr(node.op, "name") else ""
            for node in subexpressions(expr) if isinstance(node, tvm.ir.expr.Call)}


_CHILD_ATTRS = ("a", "b", "value", "condition", "true_value", "false_value")


def subexpressions(expr):
    """Every node of a TIR expression, ``expr`` included (TVM 0.27 exposes no TIR expression
    visitor to Python): a load's indices, a call's arguments and the operands of the other
    nodes."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, tvm.ir.TensorLoad):
            stack.extend(node.indices)
            continue
        if isinstance(node, tvm.ir.expr.Call):
            stack.extend(node.args)
        for attr in _CHILD_ATTRS:
            child = getattr(node, attr, None)
            if isinstance(child, tvm.ir.Expr):
                stack.append(child)


class CpuRule(ScheduleRule):
    """The guard every CPU default rule shares: it takes PrimFuncs for an LLVM (CPU) target
    only, and ``schedule`` works on a fresh schedule of one, returning None for a kernel the
    rule does not take. ``schedule`` also runs on MetaSchedule's traced schedules
    (schedules/space.py), which is why it is a method of its own."""

    # Rules that take only kernels with a reduction block (contractions, norms, attention)
    # set this: a kernel without one (most elementwise and layout kernels) is refused before
    # the rule's own analysis, which each such rule would otherwise run on it in turn.
    needs_reduction = False

    def apply(self, func, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        if self.needs_reduction and not has_reduction(func):
            return None
        return self.schedule(s_tir.Schedule(func), target, tunable)

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False):
        raise NotImplementedError


# (function, answer) of the last has_reduction question: the rules ask in turn about one kernel
_LAST_REDUCTION_ANSWER: tuple = (None, False)


def has_reduction(func: tirx.PrimFunc) -> bool:
    """Whether a block of ``func``, at any depth, has a reduction iter var (True when its
    blocks cannot be read: the rules then decide for themselves)."""
    global _LAST_REDUCTION_ANSWER
    last = _LAST_REDUCTION_ANSWER
    if last[0] is func:
        return last[1]
    try:
        sch = s_tir.Schedule(func)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # no root block (hand-written TIR)
        return True
    answer = False
    while blocks and not answer:
        block = blocks.pop()
        answer = any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)
        blocks.extend(sch.get_child_blocks(block))
    _LAST_REDUCTION_ANSWER = (func, answer)
    return answer
