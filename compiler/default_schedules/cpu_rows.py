"""Row-wise kernels on the CPU: softmax, layer norm, RMS norm and the like, where every block
either reduces the innermost axis of a row or maps it elementwise. Shared with ``Attention``,
which computes its softmax the same way under its row blocks.

``RowWise`` parallelizes over the rows (the leading axes all blocks share) and computes every
block of a row under that loop, so a row is read from L1 after its first pass; each reduction
over the row is split into one vector of partial results (rfactor) and a 16-element tail, and
the elementwise passes are vectorized. dlight's CPU Reduction, which it replaces where it
applies, left the reductions as scalar chains."""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.schedule import ScheduleError
from tvm.target import Target

from .cpu_blocks import (
    WIDE_VECTORS,
    CpuRule,
    _extent,
    divisible,
    small_enough_to_inline,
    touches_bool,
    vector_lanes,
    worth_parallel,
)


class RowWise(CpuRule):
    """See the module docstring."""

    needs_reduction = True

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

