"""Row-wise kernels on the CPU: softmax, layer norm, RMS norm and the like, where every block
either reduces the innermost axis of a row or maps it elementwise. Shared with ``Attention``,
which computes its softmax the same way under its row blocks.

``RowWise`` parallelizes over the rows (the leading axes all blocks share) and computes every
block of a row under that loop, so a row is read from L1 after its first pass; each reduction
over the row is split into one vector of partial results (rfactor) and a 16-element tail, and
the elementwise passes are vectorized. A reduction over a length no whole number of vectors
makes is first padded to one (pad_row_reductions). dlight's CPU Reduction, which it replaces
where it applies, left the reductions as scalar chains."""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.analysis import get_sblock_read_write_region
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.schedule import ScheduleError
from tvm.target import Target

from ..symbolic_padding import round_up
from .cpu_blocks import (
    WIDE_VECTORS,
    CpuRule,
    _extent,
    _int,
    divisible,
    has_reduction,
    small_enough_to_inline,
    substitute,
    touches_bool,
    uses_var,
    vector_lanes,
    worth_parallel,
)


class RowWise(CpuRule):
    """See the module docstring."""

    needs_reduction = True

    def apply(self, func, target: Target, tunable: bool):
        # has_reduction first (its answer is kept for the same func, which super() asks
        # again): most kernels have no reduction, and the padding would parse each one
        if isinstance(func, tirx.PrimFunc) and target.kind.name == "llvm" and \
                has_reduction(func):
            func = pad_row_reductions(func, lambda dtype: vector_lanes(target, dtype.bits))
        return super().apply(func, target, tunable)

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False):
        if not _reductions_read_rows(sch):
            return None
        try:
            return self._schedule(sch, target)
        except ScheduleError:
            return None

    def _schedule(self, sch, target):
        infos = normalize_prim_func(sch)
        if not infos or len(infos) < 2 or not infos[-1].is_injective():
            return None
        if not any(not info.is_injective() for info in infos):
            return None
        if not all(isinstance(d, (int, tirx.IntImm)) for i in infos for d in i.dom()):
            return None
        rows = _shared_row_axes(infos)
        if rows == 0:
            return None
        last = infos[-1].block_rv
        if touches_bool(sch, last):
            return None
        lanes = vector_lanes(target, sch.get(last).writes[0].source.dtype.bits)
        for info in infos[:-1]:
            kinds = info.dom_kind()
            if not info.is_injective() and (kinds[-1] != "R" or kinds.count("R") != 1):
                return None
        kept = inline_single_reader_blocks(sch, infos[:-1])
        row_loops = sch.get_loops(last)[:rows]
        task = sch.fuse(*row_loops) if rows > 1 else row_loops[0]
        if worth_parallel(_work(infos)):
            sch.parallel(task)
        compute_rows_under(sch, task, kept, lanes)
        schedule_injective_tail(sch, last, lanes)
        return sch


# Reducers whose padded steps add their init value: + and * only where it is their identity
# (a TE reduction's always is); max and min take it as it is (the running value started there).
_COMBINERS = {tirx.Add: 0, tirx.Mul: 1, tirx.Max: None, tirx.Min: None}


def pad_row_reductions(func: tirx.PrimFunc, lanes_of) -> tirx.PrimFunc:
    """``func`` with each reduction over its innermost loop whose length ``n`` is no multiple
    of ``lanes_of(dtype)`` run over the next multiple instead, the last vector of steps
    reading the row's last elements (_padded_block): split_row_reduction then splits it into
    whole vectors, at the cost of one vector step. A split of ``n`` itself would put a
    predicate on the partial block, which compute_at drops (it then read past the row:
    wav2vec2's GroupNorm over 3,199 steps), and which blocks its vectorizing; unsplit, the
    reduction was a scalar chain. Blocks whose loops are not their own perfect nest are left
    as they are."""
    padded = _ragged_reductions(func, lanes_of)
    if not padded:
        return func
    buffers = {b: b for b in func.params}  # buffers are their own variables in TVM 0.27
    buffers.update({b: b for b in func.body.block.alloc_buffers})

    def on_for(loop):
        realize = loop.body
        if not isinstance(realize, s_tir.SBlockRealize) or \
                realize.block.name_hint not in padded:
            return loop
        length, lanes, loop_var = padded[realize.block.name_hint]
        if not loop.loop_var.same_as(loop_var):
            return loop
        block = _padded_block(realize.block, length, lanes, buffers)
        realize = s_tir.SBlockRealize(realize.iter_values, realize.predicate, block)
        return tirx.For(loop.loop_var, loop.min, block.iter_vars[-1].dom.extent, loop.kind,
                        realize, loop.thread_binding, loop.annotations)
    return tvm_ffi.structural_map(func, [(tirx.For, on_for)])


def _ragged_reductions(func: tirx.PrimFunc, lanes_of) -> dict:
    """{block name: (n, lanes, its loop's variable)}: the root's reduction blocks that
    pad_row_reductions pads (one reduction axis, innermost, static, from 0, bound to the
    innermost of the block's own loops with no predicate; a combiner of _COMBINERS with its
    identity)."""
    sch = s_tir.Schedule(func)
    found = {}
    for block_rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(block_rv)
        loops = sch.get_loops(block_rv)
        iter_vars = list(block.iter_vars)
        reduce = [iv.iter_type == tirx.IterVar.CommReduce for iv in iter_vars]
        if not iter_vars or len(loops) != len(iter_vars) or not reduce[-1] or \
                sum(reduce) != 1 or block.init is None:
            continue
        dom, store = iter_vars[-1].dom, block.body
        if not (isinstance(dom.extent, tirx.IntImm) and isinstance(dom.min, tirx.IntImm)
                and int(dom.min) == 0) or _combined_term(store, block.init) is None:
            continue
        lanes = lanes_of(store.buffer.dtype)
        if int(dom.extent) % lanes == 0 or int(dom.extent) < lanes:
            continue
        loop = sch.get(loops[-1])
        if not (isinstance(loop.body, s_tir.SBlockRealize)
                and loop.body.iter_values[-1].same_as(loop.loop_var)
                and _int(loop.body.predicate) == 1):
            continue
        found[block.name_hint] = (int(dom.extent), lanes, loop.loop_var)
    return found


def _combined_term(store, init):
    """(term, self-load, whether the term is the first operand) of a reduction's update
    ``out = combine(out, term)``; None for another form or a combiner whose init is not its
    identity."""
    if not isinstance(store, tirx.BufferStore) or type(store.value) not in _COMBINERS:
        return None
    identity = _COMBINERS[type(store.value)]
    init_value = getattr(init, "value", None)
    if init_value is None or (identity is not None and not (
            isinstance(init_value, (tirx.FloatImm, tirx.IntImm))
            and float(init_value.value) == identity)):
        return None
    value = store.value
    for term, own, first in ((value.b, value.a, False), (value.a, value.b, True)):
        if isinstance(own, tvm.ir.TensorLoad) and own.source.same_as(store.buffer) and \
                len(own.indices) == len(store.indices) and \
                all(a.same_as(b) for a, b in zip(own.indices, store.indices)):
            return term, own, first
    return None


def _padded_block(block, length: int, lanes: int, buffers: dict):
    """The reduction block over whole vectors of ``lanes`` steps. Step k reads at
    ``min(k - k % lanes, length - lanes) + k % lanes``: itself, except in the last vector,
    which reads the row's last ``lanes`` elements (one contiguous load, inside the row) and
    adds the init value for those an earlier vector took (read below ``k - k % lanes``)."""
    iter_vars = list(block.iter_vars)
    k = iter_vars[-1].var
    dtype = str(k.ty.dtype)
    start = k - tirx.FloorMod(k, tirx.const(lanes, dtype))  # of k's vector
    step = tirx.Min(start, tirx.const(length - lanes, dtype)) + \
        tirx.FloorMod(k, tirx.const(lanes, dtype))

    def shifted(load):
        if not any(uses_var(index, k) for index in load.indices):
            return load
        return tirx.BufferLoad(load.source, [substitute(index, k, step)
                                             for index in load.indices])
    term, own, first = _combined_term(block.body, block.init)
    term = tvm_ffi.structural_map(term, (tvm.ir.TensorLoad, shifted))
    # The loads are bound outside the select: inside it, TVM's simplifier takes the select's
    # condition as given and may rewrite the index from it (a clamped index became k, and the
    # last vector read past the row's end, and the buffer's at the last row).
    loads: list = []

    def named(load):
        if not any(uses_var(index, k) for index in load.indices):
            return load
        for var, known in loads:
            if tvm_ffi.structural_equal(known, load):
                return var
        loads.append((tirx.Var(f"step{len(loads)}", str(load.ty.dtype)), load))
        return loads[-1][0]
    term = tvm_ffi.structural_map(term, (tvm.ir.TensorLoad, named))
    guarded = tirx.Select(tirx.GE(step, start), term, block.init.value)
    for var, load in reversed(loads):
        guarded = tirx.Let(var, load, guarded)
    value = type(block.body.value)(*((guarded, own) if first else (own, guarded)))
    body = tirx.BufferStore(block.body.buffer, value, block.body.indices)
    whole = round_up(length, lanes)
    iter_vars[-1] = tirx.IterVar(tvm.ir.Range(0, tirx.const(whole, dtype)), k,
                                 iter_vars[-1].iter_type)
    draft = s_tir.SBlock(iter_vars, block.reads, block.writes, block.name_hint, body,
                         block.init, block.alloc_buffers, block.match_buffers,
                         block.annotations)
    reads, writes = get_sblock_read_write_region(draft, buffers)
    return s_tir.SBlock(iter_vars, reads, writes, block.name_hint, body, block.init,
                        block.alloc_buffers, block.match_buffers, block.annotations)



def _work(infos) -> int:
    """Scalar iterations of all the blocks (their domains are static here)."""
    return sum(math.prod(int(d) for d in info.dom()) for info in infos)


def _reductions_read_rows(sch) -> bool:
    """Every reduction reduces the innermost dim of what it reads, and only that dim (a spatial
    mean in NHWC reduces H and W across the contiguous channels: Generic's case)."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        stmt = sch.get(block)
        reduce_vars = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
        if not reduce_vars:
            continue
        along_rows = False
        for region in stmt.reads:
            if region.source.same_as(stmt.writes[0].source):
                continue
            for position, dim in enumerate(region.region):
                used = tirx.analysis.undefined_vars(dim.min)
                if any(u.same_as(v) for u in used for v in reduce_vars):
                    if position != len(region.region) - 1:
                        return False
                    along_rows = True
        if not along_rows:
            return False
    return True


def _shared_row_axes(infos) -> int:
    """How many leading spatial axes (same extents) every block has: the rows."""
    leading = []
    for info in infos:
        kinds = info.dom_kind()
        count = len(kinds) - len(kinds.lstrip("S"))
        leading.append([int(d) for d in info.dom()[:count]])
    shared = 0
    while all(len(axes) > shared for axes in leading) and \
            len({axes[shared] for axes in leading}) == 1:
        shared += 1
    return shared


def inline_single_reader_blocks(sch, infos, keep=lambda _block: False) -> list:
    """Inline the elementwise blocks that one block reads (``x - max`` into exp); returns the
    blocks that stay (reductions, blocks read twice, those ``keep`` holds on to)."""
    kept = []
    for info in infos:
        block = info.block_rv
        if (info.is_injective() and len(sch.get_consumers(block)) == 1 and not keep(block)
                and small_enough_to_inline(sch, block)):
            try:
                sch.compute_inline(block)
                continue
            except ScheduleError:
                pass
        kept.append(block)
    return kept


def compute_rows_under(sch, task, blocks, lanes: int, first=()) -> None:
    """Compute ``first`` and then ``blocks`` (in order) under the parallel ``task`` loop: each
    row reduction split into a vector of partial results, elementwise blocks vectorized."""
    kept, partials = [], set()
    for block in blocks:
        if is_reduction(sch, block):
            partial = split_row_reduction(sch, block, lanes)  # at root: before compute_at
            if partial is not None:
                kept.append(partial)
                partials.add(len(kept) - 1)
        kept.append(block)
    for block in reversed([*first, *kept]):
        sch.compute_at(block, task, preserve_unit_loops=True)
    for index, block in enumerate(kept):
        if index in partials:
            vectorize_partial(sch, block)
        elif not is_reduction(sch, block):
            schedule_injective_tail(sch, block, lanes)


def split_row_reduction(sch, block, lanes: int):
    """max / sum over the keys as ``lanes`` partial results (one vector) and then one short
    reduction: a scalar chain over the keys runs at one add or max per 4 cycles of latency.
    Returns the partial block (None when rfactor does not take the reducer). At root: rfactor
    refuses a loop that other blocks share."""
    reduce = sch.get_loops(block)[-1]
    if not divisible(sch, reduce, lanes):
        return None
    _, lane = sch.split(reduce, factors=[None, lanes])
    try:
        return sch.rfactor(lane, factor_axis=len(sch.get(block).writes[0].region))
    except ScheduleError:  # a reducer rfactor does not recognize: stays scalar
        return None


def vectorize_partial(sch, block) -> None:
    """The partial max/sum block computed at the task loop: (lane, ..., row, chunk) loops
    become (row, chunk, lane) with the lanes in one vector register."""
    loops = sch.get_loops(block)
    lane, *_, row, chunk = loops[1:]
    sch.reorder(row, chunk, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(block, chunk)


def is_reduction(sch, block) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def schedule_injective_tail(sch, block, lanes: int) -> None:
    """Vectorize the innermost loop of a block computed under the task loop in steps of up
    to cpu_blocks.WIDE_VECTORS whole vectors. A loop that other blocks are computed under is
    left scalar: that is the task loop itself when the block has no loop of its own (an
    argmax's copy-out: one row per task), and TVM's vectorizer gives the intermediates
    allocated under such a loop one element for all its lanes (every lane of the row reduction
    then reads and writes the same accumulator)."""
    loops = sch.get_loops(block)
    inner = loops[-1]
    if len(sch.get_child_blocks(inner)) != 1 or not divisible(sch, inner, lanes):
        return
    width = next(lanes * v for v in (WIDE_VECTORS, WIDE_VECTORS // 2, 1)
                 if divisible(sch, inner, lanes * v))
    if _extent(sch, inner) != width:
        _, inner = sch.split(inner, factors=[None, width])
    sch.vectorize(inner)

