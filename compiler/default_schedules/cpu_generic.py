"""``Generic`` and ``RowReduction``: the default CPU schedules of everything that is not a
contraction. RowReduction is dlight's CPU Reduction where its assumptions hold (softmax and
norms over the innermost axis); Generic parallelizes every block over its outer spatial loops
and vectorizes its innermost loop, after inlining single-reader injective chains (and, into a
reduction, producers that only read, pad or widen: a pool's padded input)."""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.schedule import ScheduleError
from tvm.sym.analyzer import Analyzer
from tvm.target import Target

from .cpu_blocks import (
    CpuRule,
    _extent,
    _int,
    has_reduction,
    parallel_pays,
    schedule_injective_block,
    small_enough_to_inline,
    subexpressions,
    touches_bool,
    vector_lanes,
)


class Generic(CpuRule):
    """Fallback for every other kernel: parallel over outer spatial loops, vectorized inner loop.

    Pooling and spatial means are reductions whose innermost *output* axis (channels, in NHWC)
    is contiguous: their reduction loops are moved outside that axis so it can be vectorized."""

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False):
        root = sch.get_sblock("root")
        lanes = vector_lanes(target)
        inline_injective_chains(sch, root)
        inline_cheap_into_reductions(sch, root)
        for block in sch.get_child_blocks(root):
            self._schedule_block(sch, block, lanes)
        return sch

    @staticmethod
    def _schedule_block(sch, block, lanes: int) -> None:
        iter_vars = sch.get(block).iter_vars
        loops = sch.get_loops(block)
        if len(loops) != len(iter_vars):
            return  # not a simple loop nest (already nested); leave to LLVM
        kinds = ["S" if iv.iter_type == tirx.IterVar.DataPar else "R" for iv in iter_vars]
        if "R" in kinds and kinds[-1] == "S" and kinds.index("R") < len(kinds) - 1:
            return  # interleaved; unusual, left as is
        if "R" in kinds and len(kinds) >= 2 and kinds[-1] == "R":
            last_spatial = max(i for i, k in enumerate(kinds) if k == "S")
            ext = _extent(sch, loops[last_spatial])
            if (ext and ext >= lanes and ext % lanes == 0 and _reads_contiguous(sch, block)
                    and not touches_bool(sch, block)):
                reduce = [loop for loop, k in zip(loops, kinds) if k == "R"]
                sch.reorder(*reduce, loops[last_spatial])
                outer, inner = sch.split(loops[last_spatial], factors=[None, lanes])
                sch.reorder(outer, *reduce, inner)
                sch.vectorize(inner)
                spatial = [loop for loop, k in zip(loops, kinds) if k == "S"][:-1] + [outer]
                fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
                if parallel_pays(sch, block):
                    sch.parallel(fused)
                sch.decompose_reduction(block, reduce[0])
                return
        schedule_injective_block(sch, block, lanes)


def inline_injective_chains(sch: s_tir.Schedule, root) -> None:
    """Inline every spatial-only intermediate whose one reader is a spatial-only block of the
    same size, or a pad that reads it at its own index (_pads). EfficientNet's hardswish, left
    in NCHW between NHWC convolutions, was fused as seven blocks (two adds, transpose, clip,
    divide, transpose, multiply): seven passes over memory with two strided transposes.
    Inlined, the transposes cancel in the index arithmetic and one vectorized pass remains.
    A pad reads each element once: inlined, the head split that ViT pads from 197 tokens to
    whole vectors is one pass (a transposing one for the keys), not a copy and a copy of it.
    Producers smaller than a reader (broadcasts: squeeze-excite's per-channel sigmoid) are
    kept, as are producers of reductions: inlining would recompute them per output element.
    Producers with several readers are kept too: inlined, TVM's simplifier rewrote Softplus's
    Kahan form ``log(u) * t / (u - 1)``, u = 1 + t, into ``log(1 + t)``, losing the precision
    near zero it exists for."""
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)}
    for block in sch.get_child_blocks(root):
        stmt = sch.get(block)
        if stmt.name_hint in outputs or not _spatial_only(stmt):
            continue
        consumers = sch.get_consumers(block)
        if len(consumers) == 1 and _spatial_only(sch.get(consumers[0])) and \
                (_written_elements(sch.get(consumers[0])) == _written_elements(stmt)
                 or _pads(sch.get(consumers[0]), stmt)) and \
                small_enough_to_inline(sch, block):
            try:
                sch.compute_inline(block)
            except ScheduleError:  # e.g. not a plain computation; scheduled on its own
                continue


def _pads(consumer, producer) -> bool:
    """Whether ``consumer`` is a pad of ``producer``: its value is
    ``if_then_else(inside, producer[i, j, ...], constant)`` read at its own block variables
    (axes of one element aside), so that it reads each element of the producer once (inlined,
    nothing is recomputed; the producer's expression stays under the condition)."""
    value = getattr(consumer.body, "value", None)
    if not (isinstance(value, tvm.ir.expr.Call) and
            str(value.op.name).rsplit(".", 1)[-1] == "if_then_else"):
        return False
    _, inside, outside = value.args
    if not isinstance(inside, tvm.ir.TensorLoad) or \
            not inside.source.same_as(producer.writes[0].source) or \
            not isinstance(outside, (tirx.FloatImm, tirx.IntImm)):
        return False
    # axes of one element (pad_axis_to_blocks' single block of rows, read at b * rows + i)
    # index nothing: their variables are their minimum, and the reads are compared without them
    analyzer = Analyzer()
    own = []
    for iv in consumer.iter_vars:
        if _int(iv.dom.extent) == 1:
            analyzer.bind(iv.var, iv.dom.min)
        else:
            own.append(iv.var)
    reads = [analyzer.simplify(index) for index, extent in
             zip(inside.indices, inside.source.shape) if _int(extent) != 1]
    return len(reads) == len(own) and all(index.same_as(var) for index, var in zip(reads, own))



# What a producer inlined into a reduction may compute: reading, padding (a select on the
# position), reinterpreting and widening; no arithmetic on the values.
_CHEAP_CALLS = {"if_then_else", "reinterpret", "likely", "shift_left", "shift_right",
                "bitwise_and", "bitwise_or"}  # by name, without the prefix (prim., tirx.)
_ARITHMETIC = {"Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod"}


def inline_cheap_into_reductions(sch: s_tir.Schedule, root) -> None:
    """Inline a spatial-only intermediate whose one reader is a reduction where it only reads,
    pads or widens values (_cheap). A max pool's padded copy of its input (and, after
    MaxPoolBF16, the float32 copy of bfloat16 bits) was written whole and read again:
    inlined, the pool reads its input in place with the padding as a condition on the
    position, at the price of a few comparisons per tap. Producers that compute something
    are kept (inline_injective_chains' reason). Consumers first, so that a chain (widen, then
    pad) inlines link by link. Only producers that keep the innermost axis in place (not a
    transpose): the reduction is vectorized along it (_schedule_block)."""
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)}
    for block in reversed(sch.get_child_blocks(root)):
        stmt = sch.get(block)
        if stmt.name_hint in outputs or not _spatial_only(stmt) or not _cheap(stmt) or \
                not _reads_contiguous(sch, block):
            continue
        consumers = sch.get_consumers(block)
        if len(consumers) != 1 or _spatial_only(sch.get(consumers[0])):
            continue
        try:
            sch.compute_inline(block)
        except ScheduleError:
            continue


def _cheap(stmt) -> bool:
    value = getattr(stmt.body, "value", None)
    if value is None:
        return False
    for node in subexpressions(value):
        if isinstance(node, tvm.ir.TensorLoad):
            continue
        if isinstance(node, tvm.ir.expr.Call) and \
                str(node.op.name).rsplit(".", 1)[-1] not in _CHEAP_CALLS:
            return False
        if type(node).__name__ in _ARITHMETIC and "float" in str(node.ty):
            return False
    return True


def _spatial_only(stmt) -> bool:
    return all(iv.iter_type == tirx.IterVar.DataPar for iv in stmt.iter_vars)


def _written_elements(stmt) -> int | None:
    if len(stmt.writes) != 1:
        return None
    total = 1
    for extent in stmt.writes[0].source.shape:
        if not isinstance(extent, tirx.IntImm):
            return None
        total *= int(extent)
    return total


def _reads_contiguous(sch, block) -> bool:
    """Whether the block's last spatial iter var indexes the last dim of every buffer it reads
    and writes (pooling and means in NHWC do; a softmax row sum does not)."""
    stmt = sch.get(block)
    spatial = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    if not spatial:
        return False
    var = spatial[-1]
    for region in list(stmt.reads) + list(stmt.writes):
        last = region.region[-1]
        if not (last.min.same_as(var) and int(getattr(last.extent, "value", 0)) == 1):
            return False
    return True


class RowReduction(dl.cpu.Reduction):
    """dlight's CPU Reduction (softmax, layer norm), only where its assumption holds: all blocks
    share the same leading spatial axes. It parallelizes the last block's leading loops and
    computes every other block under them; for a softmax over [1, 1000] the normalized blocks
    disagree (max: S(1) R(1000); output: S(1000)) and it recomputed the whole max and sum for
    each of the 1000 outputs."""

    def apply(self, func, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not has_reduction(func) or \
                not _leading_spatial_axes_agree(func):
            return None
        if not _reduces_innermost(func):
            return None
        return super().apply(func, target, tunable)


def _reduces_innermost(func: tirx.PrimFunc) -> bool:
    """Whether every reduction reads its inputs along their innermost dim. A spatial mean in
    NHWC reduces H and W while C is innermost: dlight's Reduction then ran one scalar loop per
    channel, striding over memory; Generic vectorizes
    those over the channels instead."""
    sch = s_tir.Schedule(func)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        stmt = sch.get(block)
        reduce_vars = {iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}
        if not reduce_vars:
            continue
        for region in stmt.reads:
            if region.source.same_as(stmt.writes[0].source) or not region.region:
                continue
            used = tirx.analysis.undefined_vars(region.region[-1].min)
            if not any(u.same_as(v) for u in used for v in reduce_vars):
                return False
    return True


def _leading_spatial_axes_agree(func: tirx.PrimFunc) -> bool:
    infos = normalize_prim_func(s_tir.Schedule(func))
    if not infos:
        return False
    leading = []
    for info in infos:
        kinds = info.dom_kind()
        count = len(kinds) - len(kinds.lstrip("S"))
        leading.append([str(d) for d in info.dom()[:count]])
    shared = min(len(axes) for axes in leading)
    return shared > 0 and all(axes[:shared] == leading[0][:shared] for axes in leading)
