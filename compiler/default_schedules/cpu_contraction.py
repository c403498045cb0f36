"""``Contraction``: the default CPU schedule of one multiply-accumulate reduction (conv2d in
NHWC/HWIO, matmul, batch matmul) with injective producers and epilogues. Register-blocks the two
innermost output axes and vectorizes the innermost (contiguous in the output and the weight);
ragged axes are padded to whole tiles, low-intensity ones read through their padding, and the
elementwise epilogue is applied on the way out of the register tile."""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import s_tir, tirx
from tvm.ir import TensorLoad as BufferLoad
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.schedule import ScheduleError
from tvm.target import Target

from aotc.targets import simd

from .cpu_blocks import (
    _MAX_ROW_BLOCK,
    CpuRule,
    _extent,
    _largest_divisor,
    accumulator_vectors,
    parallel_pays,
    schedule_injective_block,
    small_enough_to_inline,
    vector_lanes,
)
from .cpu_depthwise import Window, find_window, inline_into_window, place_window, window_rows

# Unroll depths of the innermost reduction the tuner may try (the untuned schedule: 1).
_K_UNROLL_STEPS = (1, 2, 4, 8)


def _column_block(extent: int, lanes: int) -> int:
    """Columns per register tile: whole SIMD registers when the extent allows (a vector of
    an odd lane count is split by LLVM into slow partial operations)."""
    for width in (2 * lanes, lanes, 3 * lanes // 2, lanes // 2, lanes // 4):
        if width >= 4 and extent % width == 0:
            return width
    return _largest_divisor(extent, 2 * lanes)


def _vector_width(columns: int, lanes: int) -> int:
    """The SIMD width the register tile's columns are computed in: whole registers where the
    column count allows, else half registers (24 columns = 3 x 8 on AVX-512)."""
    for width in (lanes, lanes // 2):
        if width >= 4 and columns % width == 0:
            return width
    return columns


# Rows per register tile where the row count is symbolic (a sequence length): the rows are
# padded to a multiple of it (pad_einsum), so the tile has no remainder to mask.
SYMBOLIC_ROW_BLOCK = 4


def _tile_axes_static(info) -> bool:
    """Whether the block has a spatial axis to tile. Symbolic tile axes (a sequence length in
    [batch, seq, k] x [k, n], or both axes of attention's [seq, seq]) are padded to whole tiles
    by _pad_ragged_tile; a symbolic reduction is a plain loop; outer axes such as a symbolic
    batch are fused into the parallel loop."""
    kinds, dom = info.dom_kind(), info.dom()
    spatial = [d for d, k in zip(dom, kinds) if k == "S"]
    return bool(spatial)


def _static(extent) -> bool:
    return isinstance(extent, (int, tirx.IntImm))


def _is_multiply_accumulate(block: tirx.Stmt) -> bool:
    """True for ``C[...] = C[...] + A[...] * B[...]`` (possibly with casts), i.e. a contraction."""
    body = block.body
    if not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tirx.Add):
        return False
    terms = [body.value.a, body.value.b]
    terms = [t.value if isinstance(t, tirx.Cast) else t for t in terms]
    return any(isinstance(t, tirx.Mul) for t in terms) and any(
        isinstance(t, BufferLoad) and t.source.same_as(body.buffer) for t in terms
    )


# Reduction sizes up to this (depthwise 3x3 = 9 ... 7x7 = 49) read each input about once per
# output: a padded copy of the input costs as much memory traffic as the convolution itself.
INLINE_PRODUCERS_MAX_REDUCTION = 64


# A register tile whose taps are guarded (its zero padding inlined: inline_padding) is a
# depthwise-like kernel: few multiply-adds per byte and a weight of a few KB. Two things differ
# from the tile of a dense contraction:
# - Accumulators: each guarded load is a branch, and across those branches LLVM keeps at most
#   14 accumulator vectors in registers; with more it stores and reloads every one per tap.
# - Order of the parallel tiles: pixels first, channel blocks inside. TVM hands each thread a
#   contiguous range of the parallel loop, so each core then reads the band of rows that it
#   wrote itself in the layer before (a 1x1 conv, whose tiles are pixels first when its weight
#   is small: cpu_dot.pixels_first). Channel blocks first make every core read the whole
#   image, half of it from the other core.
GUARDED_TILE_ACCUMULATORS = 14


def inline_padding(sch: s_tir.Schedule, main, infos) -> bool:
    """Inline the producers (the zero-padded input copy) of a low-intensity contraction into
    it: writing and re-reading a padded copy costs such a kernel more than its arithmetic;
    inlined, the bounds check is one scalar condition per vector of channels."""
    reduction = 1
    for kind, extent in zip(main.dom_kind(), main.dom()):
        if kind == "R":
            if not _static(extent):
                return False  # a symbolic reduction (over a sequence) is not low-intensity
            reduction *= int(extent)
    if reduction > INLINE_PRODUCERS_MAX_REDUCTION:
        return False
    inlined = False
    for producer in infos[:infos.index(main)]:
        try:
            sch.compute_inline(producer.block_rv)
            inlined = True
        except ScheduleError:
            continue
    return inlined


def _pad_ragged_tile(sch: s_tir.Schedule, main, lanes: int) -> bool:
    """Pad the two tile axes to whole vectors/rows when they have no usable divisor.

    Attention over 197 tokens (ViT) makes a 197x197 score matrix: 197 is prime, so without
    padding the register tile degenerates to one scalar, and masked tails (a non-dividing
    split) keep LLVM from vectorizing. pad_einsum copies the operands into buffers padded with
    zeros and the result back out: the kernel proper runs on whole tiles."""
    kinds, dom = main.dom_kind(), main.dom()
    spatial = [i for i, k in enumerate(kinds) if k == "S"]
    if len(spatial) < 2 or "R" not in kinds:
        return False
    padding = [1] * len(kinds)
    if not _static(dom[spatial[-1]]):
        padding[spatial[-1]] = lanes
    elif int(dom[spatial[-1]]) > lanes and _column_block(int(dom[spatial[-1]]), lanes) < 4:
        padding[spatial[-1]] = lanes
    if not _static(dom[spatial[-2]]):
        padding[spatial[-2]] = SYMBOLIC_ROW_BLOCK
    elif int(dom[spatial[-2]]) > _MAX_ROW_BLOCK and \
            _largest_divisor(int(dom[spatial[-2]]), _MAX_ROW_BLOCK) <= 2:
        padding[spatial[-2]] = 4
    if padding == [1] * len(kinds):
        return False
    try:
        sch.pad_einsum(main.block_rv, padding)
    except ScheduleError:
        # TVM takes no strided read as an einsum (a strided conv): a static extent then keeps
        # its ragged tile, which beats losing the rule to the generic schedule; a symbolic one
        # must be padded (the tiles assume whole blocks), so the rule gives the kernel up
        if any(not _static(dom[i]) for i, pad in enumerate(padding) if pad > 1):
            raise
        return False
    return True


def _parallelize_outer(sch: s_tir.Schedule, block) -> None:
    """Parallel over the block's fused loops, nothing vectorized."""
    loops = sch.get_loops(block)
    if parallel_pays(sch, block):
        sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])


def _blocks_and_contraction(sch: s_tir.Schedule):
    """(normalized blocks, the one reduction among them); the reduction is None unless there
    is exactly one. Read again after a primitive that adds or removes blocks."""
    infos = normalize_prim_func(sch)
    reductions = [i for i in infos or [] if not i.is_injective()]
    return infos, reductions[0] if len(reductions) == 1 else None


def _same_output_shape(sch: s_tir.Schedule, producer, consumer) -> bool:
    """Whether ``consumer`` writes a buffer of the shape ``producer`` writes. TVM's
    reverse_compute_inline accepts a consumer that reads only part of its producer (a crop of
    channels padded to whole blocks, a slice of a combined projection) and then runs it over
    the producer's whole domain: the int8 classifier of MobileNetV2 (1008 padded columns, 1000
    real) wrote 8 floats past its output and corrupted the heap. Such a consumer is scheduled
    on its own instead."""
    def shape(block):
        return [int(d) if isinstance(d, tirx.IntImm) else d
                for d in sch.get(block).writes[0].source.shape]
    first, second = shape(producer), shape(consumer)
    return len(first) == len(second) and all(
        isinstance(a, int) and isinstance(b, int) and a == b or
        not isinstance(a, int) and not isinstance(b, int) and a.same_as(b)
        for a, b in zip(first, second))


@dataclass
class _Nest:
    """The contraction block's loops before tiling, and what the tile's way out needs."""
    block: object
    spatial: list
    reduce: list
    epilogues: list = field(default_factory=list)
    lanes: int = 16
    padded: bool = False  # by _pad_ragged_tile: the first epilogue crops the padded result

    @classmethod
    def of(cls, sch, main, epilogues, lanes: int, padded: bool) -> _Nest:
        kinds, loops = main.dom_kind(), sch.get_loops(main.block_rv)
        return cls(main.block_rv, [loop for loop, k in zip(loops, kinds) if k == "S"],
                   [loop for loop, k in zip(loops, kinds) if k == "R"], epilogues, lanes,
                   padded)


@dataclass
class TilePlan:
    """How the two innermost output axes were split into a register tile: ``col_outer`` and
    ``row_out`` go parallel, ``row_in`` x ``col_vectors`` x ``col_in`` is the tile (rows,
    vectors of ``vector`` lanes, lanes), ``k_inner`` an unrolled reduction step around it.
    ``pixels_first``: parallel over output pixels before column blocks; ``window``: a
    depthwise input window placed under the tap rows (cpu_depthwise.py)."""
    col_outer: object
    col_in: object
    vector: int
    col_vectors: object = None
    row_out: object = None
    row_in: object = None
    k_inner: object = None
    pixels_first: bool = False
    window: Window | None = None


class Contraction(CpuRule):
    """Register-blocked, vectorized schedule for conv2d (NHWC/HWIO), matmul and batch matmul."""

    needs_reduction = True

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False):
        """Schedule the ``main`` of ``sch`` in place (``sch`` may be MetaSchedule's traced
        schedule: schedules/space.py); None when the kernel is not a contraction. With
        ``tunable``, the register tile (rows x columns) is a sampled decision whose default
        is the choice made without tuning."""
        infos, main = _blocks_and_contraction(sch)
        if main is None or not _is_multiply_accumulate(sch.get(main.block_rv)):
            return None
        if not _tile_axes_static(main):
            return None  # symbolic tile or reduction extents go to the generic rule
        lanes = vector_lanes(target, sch.get(main.block_rv).writes[0].source.dtype.bits)
        accumulators = accumulator_vectors(target)
        registers = simd(target)[1]
        window = find_window(sch, main, infos, lanes, registers)
        if window is not None:
            window = inline_into_window(sch, main, infos, window)
            infos, main = _blocks_and_contraction(sch)  # producers went into the copy
            if window is not None:
                self._schedule_window(sch, main, infos, window, lanes, registers, tunable)
                return sch
        guarded = inline_padding(sch, main, infos)
        if guarded:
            infos, main = _blocks_and_contraction(sch)
            accumulators = min(accumulators, GUARDED_TILE_ACCUMULATORS)
        padded = _pad_ragged_tile(sch, main, lanes)
        if padded:
            infos, main = _blocks_and_contraction(sch)
        main_index = infos.index(main)
        for producer in infos[:main_index]:
            if padded:  # guarded copies (if_then_else on the padded axis): not vectorized
                _parallelize_outer(sch, producer.block_rv)
            else:
                schedule_injective_block(sch, producer.block_rv, lanes)
        nest = _Nest.of(sch, main, infos[main_index + 1:], lanes, padded)
        self._schedule_main(sch, nest, accumulators, tunable, pixels_first=guarded)
        return sch

    def _schedule_main(self, sch, nest: _Nest, accumulators: int, tunable: bool = False,
                       pixels_first: bool = False) -> None:
        spatial, lanes = nest.spatial, nest.lanes
        col_ext = _extent(sch, spatial[-1])
        # a symbolic column axis was padded to whole vectors (_pad_ragged_tile)
        col_inner = _column_block(col_ext, lanes) if col_ext is not None else lanes
        row_ext = _extent(sch, spatial[-2]) if len(spatial) >= 2 else None
        if tunable and col_inner % lanes == 0 and (row_ext is not None or len(spatial) < 2):
            self._schedule_main_sampled(sch, nest, col_inner, row_ext, accumulators,
                                        pixels_first)
            return
        col_outer, col_in = sch.split(spatial[-1], factors=[None, col_inner])
        vector = _vector_width(col_inner, lanes)
        col_vectors = None
        if vector < col_inner and col_inner % lanes:
            # 24 columns: three 8-lane vectors (not one 24-lane vector: see
            # _column_block), unrolled like the rows
            col_vectors, col_in = sch.split(col_in, factors=[None, vector])
        vectors = max(1, col_inner // vector)
        row_out, row_in = None, None
        if len(spatial) >= 2:
            row_limit = max(1, min(_MAX_ROW_BLOCK, accumulators // vectors))
            row_inner = _largest_divisor(row_ext, row_limit) if row_ext is not None \
                else SYMBOLIC_ROW_BLOCK  # padded to it (_pad_ragged_tile)
            row_out, row_in = sch.split(spatial[-2], factors=[None, row_inner])
        self._tile(sch, nest, TilePlan(col_outer, col_in, vector, col_vectors, row_out, row_in,
                                       pixels_first=pixels_first))

    def _schedule_window(self, sch, main, infos, window: Window, lanes: int, registers: int,
                         tunable: bool) -> None:
        """A depthwise conv whose padded input is read through a window (cpu_depthwise.py):
        one vector of channels per tile, as many output pixels as the window allows (with
        ``tunable``, a sampled decision among them whose default is the largest)."""
        block = main.block_rv
        loops = sch.get_loops(block)
        spatial, reduce = loops[:-2], loops[-2:]
        rows = window_rows(window, _extent(sch, spatial[-2]), registers)
        if tunable:
            rows = sch.sample_categorical(rows, [1 / len(rows)] * len(rows), decision=0)
        else:
            rows = rows[0]
        row_out, row_in = sch.split(spatial[-2], factors=[None, rows])
        col_outer, col_in = sch.split(spatial[-1], factors=[None, lanes])
        nest = _Nest(block, spatial, reduce, infos[infos.index(main) + 1:], lanes)
        self._tile(sch, nest, TilePlan(col_outer, col_in, lanes, row_out=row_out, row_in=row_in,
                                       pixels_first=True, window=window))

    def _schedule_main_sampled(self, sch, nest: _Nest, default_cols: int, row_ext: int | None,
                               accumulators: int, pixels_first: bool = False) -> None:
        """The same tile with its shape sampled: columns among whole-vector widths that divide
        the axis, rows among the divisors that keep the accumulators in registers; the
        default decisions are the untuned choices, so the untuned schedule is one point of
        the space (schedules/space.py)."""
        spatial, lanes = nest.spatial, nest.lanes
        cols = [c for c in (lanes, 2 * lanes, 3 * lanes, 4 * lanes)
                if _extent(sch, spatial[-1]) % c == 0]
        col_rv = sch.sample_categorical(cols, [1 / len(cols)] * len(cols),
                                        decision=cols.index(default_cols))
        col_outer, col_in = sch.split(spatial[-1], factors=[None, col_rv])
        col_vectors, col_in = sch.split(col_in, factors=[None, lanes])
        row_out, row_in = None, None
        if row_ext is not None:
            row_limit = max(1, min(_MAX_ROW_BLOCK, accumulators // (max(cols) // lanes)))
            default_rows = _largest_divisor(
                row_ext, max(1, min(_MAX_ROW_BLOCK, accumulators // (default_cols // lanes))))
            rows = sorted({r for r in range(1, _MAX_ROW_BLOCK + 1)
                           if row_ext % r == 0 and r <= row_limit} | {default_rows})
            row_rv = sch.sample_categorical(rows, [1 / len(rows)] * len(rows),
                                            decision=rows.index(default_rows))
            row_out, row_in = sch.split(spatial[-2], factors=[None, row_rv])
        nest.reduce, k_inner = self._sample_k_unroll(sch, nest.reduce)
        self._tile(sch, nest, TilePlan(col_outer, col_in, lanes, col_vectors, row_out, row_in,
                                       k_inner, pixels_first))

    @staticmethod
    def _sample_k_unroll(sch, reduce):
        """A third decision: how many steps of the innermost reduction to unroll around the
        register tile (more independent FMAs in flight, more code). The default, 1, is the
        untuned schedule (a loop of extent 1)."""
        if not reduce:
            return reduce, None
        extent = _extent(sch, reduce[-1]) or 1
        steps = [k for k in _K_UNROLL_STEPS if extent % k == 0]
        k_rv = sch.sample_categorical(steps, [1 / len(steps)] * len(steps), decision=0)
        k_outer, k_inner = sch.split(reduce[-1], factors=[None, k_rv])
        return reduce[:-1] + [k_outer], k_inner

    def _tile(self, sch, nest: _Nest, plan: TilePlan) -> None:
        """Parallel tiles, register accumulators, epilogue on the way out (every path)."""
        block, reduce, epilogues, lanes = nest.block, nest.reduce, nest.epilogues, nest.lanes
        row_in, col_vectors, col_in = plan.row_in, plan.col_vectors, plan.col_in
        outer = nest.spatial[:-2] + ([plan.row_out] if plan.row_out is not None else [])
        inner = [loop for loop in (plan.k_inner, row_in, col_vectors) if loop is not None]
        inner.append(col_in)
        # col_outer first: neighbouring parallel iterations reuse the same weight columns;
        # pixels first for guarded tiles (see GUARDED_TILE_ACCUMULATORS).
        parallel = [*outer, plan.col_outer] if plan.pixels_first else [plan.col_outer, *outer]
        sch.reorder(*parallel, *reduce, *inner)
        tile = sch.fuse(*parallel)
        if parallel_pays(sch, block):
            sch.parallel(tile)
        if plan.window is not None:  # under the tap rows; the taps of a row unrolled over it
            place_window(sch, plan.window, reduce[0])
            sch.unroll(reduce[1])
        # Accumulate in a small tile buffer (registers after unroll/vectorize), then apply
        # the epilogue on the way out. Scope "global", not "local": TVM's LowerTVMBuiltin puts
        # only small (< 1 KB) *global* CPU allocations on the stack; a "local" one became a
        # TVMBackendAllocWorkspace/FreeWorkspace pair in every parallel tile. (Larger ones
        # are such a pair too. Annotated to stay on the stack, they become 16-byte-aligned
        # allocas, as TVM's LLVM codegen caps an alloca's alignment, and every 64-byte access
        # to them splits: cpu_dot.STACK_TILE_ACCUMULATORS.)
        write_back = sch.cache_write(block, 0, "global")
        # After pad_einsum the first epilogue copies the padded result into the real output.
        # Inlining that copy into the write-back dropped its bounds (TVM wrote the padded tile
        # into the unpadded output: out of bounds). Instead the rest of the chain is inlined
        # into the copy, which is computed under the tile loop, where reverse_compute_at clips
        # it to the real extent.
        unpad = epilogues[0].block_rv if nest.padded else None
        self._inline_epilogues(sch, unpad or write_back,
                               epilogues[1:] if nest.padded else epilogues, lanes)
        sch.reverse_compute_at(write_back, tile, preserve_unit_loops=True)
        wb_loops = sch.get_loops(write_back)[1:]
        if wb_loops:
            last = wb_loops[-1]
            if col_vectors is not None:
                _, last = sch.split(last, factors=[None, plan.vector])
            sch.vectorize(last)
        if unpad is not None:
            sch.reverse_compute_at(unpad, tile, preserve_unit_loops=True)
        # Vectorize before decomposing: afterwards the update block is no longer a complete
        # reduction block and `vectorize` refuses it.
        if row_in is not None and (_extent(sch, row_in) or 2) > 1:
            sch.unroll(row_in)
        if col_vectors is not None:
            sch.unroll(col_vectors)
        if plan.k_inner is not None:
            sch.unroll(plan.k_inner)
        sch.vectorize(col_in)
        if reduce:
            sch.decompose_reduction(block, reduce[0])

    @staticmethod
    def _inline_epilogues(sch, write_back, epilogues, lanes: int) -> None:
        """Fold the elementwise chain after the contraction into its write-back.

        Stops at the first block that is not the sole reader of the write-back's output: TVM's
        reverse_compute_inline accepts that case and then leaves the other reader with an
        undefined buffer (GELU's ``x * erf(x)`` failed to build that way). So first every
        intermediate of the chain is inlined into its readers (``x * sigmoid(x)`` becomes one
        block reading x twice); otherwise a conv+SiLU kernel runs the sigmoid and the multiply
        as two more passes over the whole output."""
        remaining = list(epilogues)
        for block in reversed(epilogues[:-1]):
            if not small_enough_to_inline(sch, block.block_rv):
                continue
            try:
                sch.compute_inline(block.block_rv)
            except ScheduleError:  # e.g. a block that is not a plain injective computation
                continue
            remaining.remove(block)
        while remaining:
            consumers = sch.get_consumers(write_back)
            if len(consumers) != 1 or not sch.get(consumers[0]).same_as(
                    sch.get(remaining[0].block_rv)):
                break
            if not _same_output_shape(sch, write_back, remaining[0].block_rv):
                break  # a crop or slice: see _same_output_shape
            if not small_enough_to_inline(sch, write_back, into=remaining[0].block_rv):
                break  # see cpu_blocks.MAX_INLINED_NODES
            try:
                sch.reverse_compute_inline(remaining[0].block_rv)
            except ScheduleError:  # not elementwise: stays at root
                break
            remaining.pop(0)
        for block in remaining:
            schedule_injective_block(sch, block.block_rv, lanes)
