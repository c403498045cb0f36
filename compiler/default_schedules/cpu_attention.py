"""``Attention``: the default CPU schedule of the kernel FuseAttention makes (scores = Q @ Kt,
scale and mask, softmax over the keys, out = probabilities @ V, in one PrimFunc).

Parallel over (batch, head, block of query rows: ``rows_per_task``); under each block the
scores, the softmax and the weighted sum of that block's rows are computed one after the other
in buffers of ``rows x keys`` floats, which stay in L1 or L2, instead of three kernels passing
the whole score matrix through memory. Both products are register-tiled and vectorized over
their contiguous axis (keys for the scores, the head dim for the output); the key count is a
whole number of vectors (FuseAttention pads it).

The bf16 attention kernel (compiler/attention_kernels.py, ``--precision bf16``) gets the same
schedule, with each product's lane loop tensorized onto ``vdpbf16ps`` (a pair of head-dim
values a step for the scores, a pair of keys for the output) instead of vectorized; on a target
without AVX512-BF16 the rule leaves it to the others. On AMX (``_schedule_amx``) both products
are rows of AMX tiles instead, in tasks of 16 query rows (8 where the padded rows are not a
multiple of 16; AttentionBF16 pads static ones to 16)."""

from __future__ import annotations

import math

from tvm import s_tir
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.schedule import ScheduleError
from tvm.target import Target

from aotc.targets import amx_bf16, bf16_dot, broadcast_register, simd, x86

from ..attention_kernels import GROUP, LANES, PACK_BLOCKS, SCORES_BLOCK
from . import amx_intrinsics
from .cpu_blocks import CpuRule, _extent, _largest_divisor, divisible, vector_lanes
from .cpu_contraction import _is_multiply_accumulate
from .cpu_dot import amx_min_step, tile_shape
from .cpu_rows import (
    compute_rows_under,
    inline_single_reader_blocks,
    is_reduction,
    schedule_injective_tail,
)
from .dot_intrinsics import BF16_LLVM, BF16_16x2

ROWS = 8  # query rows per parallel task (FuseAttention pads the rows to a multiple of 8)
# Long keys: every task streams its head's K and V, which past L2 come from L3 each time; a
# task of more rows (up to LONG_ROWS, dividing the padded rows) reads them once for more
# queries. Long: K and V of one head together over LONG_KEYS_BYTES (the 512 KB L2 of the
# smallest-cache x86 CPUs these presets cover; measurements: docs/design/measurements.md), and
# only while the tasks still number TASKS_PER_CORE per core: a core that draws one task more
# than another then waits at most an eighth of its work.
LONG_ROWS = 32
LONG_KEYS_BYTES = 512 * 1024
TASKS_PER_CORE = 8
OUT_VECTORS = 16  # accumulators of the output tile: ROWS x (OUT_VECTORS / ROWS) vectors
# bf16 register tiles: 4 rows x up to 4 vectors (of keys for the scores, of the head dim for
# the output). Each broadcast pair of a row then feeds up to 4 vdpbf16ps; the float32 tiles
# take their activation as a memory operand of the FMA, which vdpbf16ps here does not.
BF16_TILE_ROWS = 4
SCORE_VECTORS = 4


def _attention_blocks(sch: s_tir.Schedule):
    """(scores block, output block, the blocks between) or None when the kernel is not
    matmul -> (injective)* -> max -> ... -> sum -> ... -> matmul."""
    infos = normalize_prim_func(sch)
    if not infos:
        return None
    reductions = [i for i, info in enumerate(infos) if not info.is_injective()]
    if len(reductions) != 4:
        return None
    first, last = infos[reductions[0]], infos[reductions[-1]]
    macs = [_is_multiply_accumulate(sch.get(infos[i].block_rv)) for i in reductions]
    if macs != [True, False, False, True] or reductions[0] != 0:
        return None
    return first, last, infos[reductions[0] + 1:reductions[-1]], infos[reductions[-1] + 1:]


def rows_per_task(sch, batch, rows, keys, head_dim, target: Target) -> int:
    """Query rows of one parallel task: ROWS, or for long keys (K and V of a head over
    LONG_KEYS_BYTES) the most rows up to LONG_ROWS, a multiple of ROWS dividing the (static)
    row count, that leave TASKS_PER_CORE tasks per core."""
    extents = [_extent(sch, loop) for loop in (*batch, rows, keys, head_dim)]
    if any(e is None for e in extents):
        return ROWS
    *batch_extents, row_count, key_count, dim = extents
    if 2 * key_count * dim * 4 <= LONG_KEYS_BYTES:
        return ROWS
    heads = math.prod(batch_extents)
    cores = int(target.attrs.get("num-cores", 1))
    for task_rows in range(LONG_ROWS, ROWS, -ROWS):
        if row_count % task_rows == 0 and heads * row_count // task_rows >= \
                TASKS_PER_CORE * cores:
            return task_rows
    return ROWS


# AMX: query rows of a task (one tile of sums: up to 16; fewer when the padded rows are not
# a multiple of 16, down to ROWS)
AMX_TASK_ROWS = 16


def _amx_shapes(sch, rows, keys, cols) -> tuple[int, int, int] | None:
    """(query rows a task, keys, head dim) of a bf16 attention kernel AMX tiles can take: all
    static, the rows a whole number of tasks, both reductions (head dim, keys) a whole number
    of steps of amx_min_step or more; None otherwise."""
    row_count, key_count, dim = (_extent(sch, loop) for loop in (rows, keys, cols))
    if row_count is None or key_count is None or dim is None or dim % LANES or \
            key_count % LANES:
        return None
    task_rows = AMX_TASK_ROWS if row_count % AMX_TASK_ROWS == 0 else ROWS
    if row_count % task_rows or min(amx_intrinsics.step("bf16", dim), amx_intrinsics.step(
            "bf16", key_count)) < amx_min_step("bf16"):
        return None
    return task_rows, key_count, dim


def _write_output_at(sch, out, epilogues, loop, lanes: int) -> bool:
    """The output product's tile written back under ``loop``, the epilogues inlined into the
    write-back; False where an epilogue cannot be."""
    write_back = sch.cache_write(out.block_rv, 0, "global")
    for block in epilogues:
        try:
            sch.reverse_compute_inline(block.block_rv)
        except ScheduleError:
            return False
    sch.reverse_compute_at(write_back, loop, preserve_unit_loops=True)
    schedule_injective_tail(sch, write_back, lanes)
    return True


def _rows_under_task(sch, task, scores, out, middle, lanes: int) -> None:
    """The scores and the softmax computed under the parallel task, for its rows. The
    probabilities the output product reads are kept (inlined, each key of the product would
    divide by the row sum again)."""
    out_name = sch.get(out.block_rv).name_hint
    kept = inline_single_reader_blocks(
        sch, middle, keep=lambda block: any(sch.get(c).name_hint == out_name
                                            for c in sch.get_consumers(block)))
    compute_rows_under(sch, task, kept, lanes, first=[scores.block_rv])


def _inline_score_adjustments(sch, write_back) -> None:
    """The scale and mask applied as the score tile is written (one pass less over the rows)."""
    consumers = sch.get_consumers(write_back)
    if len(consumers) == 1 and not is_reduction(sch, consumers[0]):
        try:
            sch.reverse_compute_inline(consumers[0])
        except ScheduleError:
            pass


class Attention(CpuRule):
    """See the module docstring."""

    needs_reduction = True

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False):
        found = _attention_blocks(sch)
        if found is None:
            return None
        scores, out, middle, epilogues = found
        bf16 = sch.get(scores.block_rv).name_hint == SCORES_BLOCK
        if bf16 and bf16_dot(target) != "avx512-bf16":
            return None
        lanes = vector_lanes(target, sch.get(out.block_rv).writes[0].source.dtype.bits)
        *batch, rows, cols, keys = sch.get_loops(out.block_rv)
        # keys and query rows may be symbolic (a sequence length): FuseAttention pads them
        # to whole vectors and row blocks; the head dim is static
        if _extent(sch, cols) is None or not divisible(sch, cols, lanes) or \
                not divisible(sch, keys, lanes) or \
                (_extent(sch, rows) is None and not divisible(sch, rows, ROWS)):
            return None
        amx = _amx_shapes(sch, rows, keys, cols) if bf16 and amx_bf16(target) else None
        if amx is not None:
            return self._schedule_amx(sch, scores, out, middle, epilogues, lanes, amx)
        task_rows = rows_per_task(sch, batch, rows, keys, cols, target)
        row_out, row_in = sch.split(rows, factors=[None, task_rows])
        registers = simd(target)[1]
        in_register = not bf16 and broadcast_register(target)
        if in_register:
            # No embedded-broadcast operand (AVX2): each broadcast probability takes a
            # register, and 8 rows x 2 vectors of accumulators would not leave it one. The
            # packed kernels' tile for such targets (cpu_dot.tile_shape) instead.
            tile_rows, col_vectors = tile_shape(_extent(sch, cols) // lanes, task_rows,
                                                registers, max_rows=ROWS,
                                                broadcast_register=True)
        else:
            # bf16: a tile of BF16_TILE_ROWS rows, so that each broadcast feeds more vectors
            tile_rows = BF16_TILE_ROWS if bf16 else ROWS
            col_vectors = _largest_divisor(_extent(sch, cols) // lanes,
                                           OUT_VECTORS // tile_rows)
        col_tiles, col_out, col_in = sch.split(cols, factors=[None, col_vectors, lanes])
        # bf16: each step of the weighted sum takes a pair of keys (vdpbf16ps)
        keys, pair = sch.split(keys, factors=[None, GROUP]) if bf16 else (keys, None)
        row_sub, row_in = sch.split(row_in, factors=[None, tile_rows])
        sch.reorder(*batch, row_out, col_tiles, row_sub, keys, row_in, col_out, col_in,
                    *([pair] if bf16 else []))
        task = sch.fuse(*batch, row_out)
        sch.parallel(task)
        # at the row tile: the accumulators are indexed by constants after unrolling, so LLVM
        # keeps them in registers
        if not _write_output_at(sch, out, epilogues, row_sub, lanes):
            return None
        _rows_under_task(sch, task, scores, out, middle, lanes)
        _inline_score_adjustments(sch, self._tile_scores(
            sch, scores.block_rv, lanes, tile_rows, bf16, registers if in_register else None))
        sch.unroll(row_in)
        sch.unroll(col_out)
        if not bf16:
            sch.vectorize(col_in)
        sch.decompose_reduction(out.block_rv, keys)
        if bf16:
            sch.tensorize(col_in, BF16_16x2)
            sch.annotate(task, "pragma_import_llvm", BF16_LLVM)
        return sch

    @staticmethod
    def _schedule_amx(sch, scores, out, middle, epilogues, lanes: int, shapes):
        """The bf16 kernel on AMX tiles: parallel over (batch, head, block of ``task_rows``
        query rows); under each block the scores, then the softmax, then the weighted sum, each
        product a row of AMX tiles (amx_intrinsics.register: the scores over the head dim,
        the output over the keys, each tile of 16 or 32 columns one intrinsic call)."""
        task_rows, keys_count, dim = shapes
        x86.request_amx()  # kernels may run in this process (constant folding, tests)
        *batch, rows, cols, keys = sch.get_loops(out.block_rv)
        row_out, row_in = sch.split(rows, factors=[None, task_rows])
        col_width = amx_intrinsics.b_tiles(dim) * LANES
        col_tiles, col_in = sch.split(cols, factors=[None, col_width])
        sch.reorder(*batch, row_out, col_tiles, row_in, col_in, keys)
        task = sch.fuse(*batch, row_out)
        sch.parallel(task)
        if not _write_output_at(sch, out, epilogues, col_tiles, lanes):
            return None
        _rows_under_task(sch, task, scores, out, middle, lanes)
        # the scores: rows x a tile of keys, over the head dim
        score_rows, score_cols, depth = sch.get_loops(scores.block_rv)[-3:]
        score_width = amx_intrinsics.b_tiles(keys_count) * LANES
        score_tiles, score_in = sch.split(score_cols, factors=[None, score_width])
        sch.reorder(score_tiles, score_rows, score_in, depth)
        score_back = sch.cache_write(scores.block_rv, 0, "global")
        sch.reverse_compute_at(score_back, score_tiles, preserve_unit_loops=True)
        schedule_injective_tail(sch, score_back, lanes)
        _inline_score_adjustments(sch, score_back)
        sch.tensorize(score_rows, amx_intrinsics.register(
            "bf16", task_rows, 1, score_width // LANES, dim, amx_intrinsics.step("bf16", dim)))
        sch.tensorize(row_in, amx_intrinsics.register(
            "bf16", task_rows, 1, col_width // LANES, keys_count,
            amx_intrinsics.step("bf16", keys_count)))
        return sch

    @staticmethod
    def _tile_scores(sch, block, lanes: int, tile_rows: int, bf16: bool,
                     registers: int | None = None):
        """``tile_rows`` rows x one vector of keys accumulated across the head dim in a register
        tile, then written to the row block's scores (bf16: up to SCORE_VECTORS vectors, a
        pair of head-dim values a step). With ``registers`` (the broadcast query value takes
        one: AVX2), cpu_dot.tile_shape's rows and key vectors for those registers."""
        rows, cols, depth = sch.get_loops(block)[-3:]
        keys = _extent(sch, cols)  # None: symbolic (a multiple of lanes)
        vectors = _largest_divisor(keys // lanes, SCORE_VECTORS) if bf16 and keys else 1
        if registers is not None:
            tile_rows, vectors = tile_shape(keys // lanes if keys else 1, _extent(sch, rows),
                                            registers, max_rows=ROWS, broadcast_register=True)
        col_out, col_vec, col_in = sch.split(cols, factors=[None, vectors, lanes])
        depth, pair = sch.split(depth, factors=[None, GROUP]) if bf16 else (depth, None)
        row_sub, rows = sch.split(rows, factors=[None, tile_rows])
        sch.reorder(col_out, row_sub, depth, rows, col_vec, col_in, *([pair] if bf16 else []))
        write_back = sch.cache_write(block, 0, "global")
        sch.reverse_compute_at(write_back, row_sub, preserve_unit_loops=True)
        schedule_injective_tail(sch, write_back, lanes)
        sch.unroll(rows)
        sch.unroll(col_vec)
        if not bf16:
            sch.vectorize(col_in)
        sch.decompose_reduction(block, depth)
        if bf16:
            sch.tensorize(col_in, BF16_16x2)
        return write_back


class AttentionPacks(CpuRule):
    """The kernels that pack the bf16 attention kernel's Kt and V (attention_kernels.pack_keys
    and pack_values, with the head-split slices and transposes FuseOps put in front of them):
    everything inlined into the pack, parallel over its blocks, and for each pair of values
    (g), the 16 lanes of a block (l) as one vector. Each vector then reads 16 neighbouring
    head-dim values of one token (V) or one head-dim value of 16 tokens (Kt) and writes every
    other bf16 of the block; the generic schedule did the kernel one value at a time."""

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False):
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        if not blocks or sch.get(blocks[-1]).name_hint not in PACK_BLOCKS:
            return None
        try:
            for block in blocks[:-1]:
                sch.compute_inline(block)
        except ScheduleError:
            return None
        *outer, _pairs, lanes, group = sch.get_loops(blocks[-1])
        if _extent(sch, lanes) != LANES or _extent(sch, group) != GROUP:
            return None
        sch.reorder(group, lanes)
        sch.vectorize(lanes)
        sch.unroll(group)
        if outer:
            sch.parallel(sch.fuse(*outer))
        return sch

