"""``PackedDot``: the default schedule of the packed contractions (compiler/dot_kernels.py:
int8 from quantize/realize.py, bf16 from quantize/bf16.py, fp16 from quantize/fp16.py,
float32 from passes/layout/prepack_weights.py), tensorized onto the target's dot-product
instruction (the float32 and float16 ones: their lane loop vectorized into FMAs).

The register tile is R output rows x V blocks of 16 output channels, kept in R*V vector
accumulators; each step of the reduction broadcasts G activation values per row and reads one
16xG weight block per V, which the instruction multiplies and adds (int8: ``vpdpbusd``, G=4,
4x an fp32 FMA's multiply-adds; bf16: ``vdpbf16ps``, G=2). Kernels of targets without the
instruction are left to ``Contraction`` (plain multiply-adds: correct, slower than fp32).
The measurements behind the tile choices below:
docs/design/measurements.md#compilerdefault_schedulescpu_dotpy."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tvm import ir as tvm_ir
from tvm import s_tir, tirx
from tvm import sym as tvm_arith
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.schedule import ScheduleError
from tvm.target import Target

from aotc.targets import (
    amx_bf16,
    amx_int8,
    bf16_dot,
    broadcast_register,
    fp16_dot,
    int8_dot,
    simd,
    x86,
)

from ..dot_kernels import CLAMPED_ROWS_BLOCK, CROP_BLOCK, FORMATS, DotFormat
from . import amx_intrinsics
from .cpu_blocks import (
    CpuRule,
    _extent,
    _largest_divisor,
    schedule_injective_block,
    vector_lanes,
)
from .cpu_contraction import GUARDED_TILE_ACCUMULATORS, Contraction, inline_padding
from .dot_intrinsics import BF16_LLVM, BF16_16x2, VNNI_16x4

# (format name, the target's instruction set for it) -> (tensor intrinsic, LLVM IR it calls);
# float32: no intrinsic, every CPU target has vector multiply-adds
INTRINSICS = {("int8", "avx512-vnni"): (VNNI_16x4, None),
              ("bf16", "avx512-bf16"): (BF16_16x2, BF16_LLVM),
              ("fp16", "avx512-fp16"): (None, None),  # <32 x half> FMAs: LLVM's vfmadd231ph
              ("fp32", "fma"): (None, None)}
_INSTRUCTIONS = {"int8": int8_dot, "bf16": bf16_dot, "fp16": fp16_dot,
                 "fp32": lambda _target: "fma"}
_MAX_ROWS, _MAX_CHANNEL_BLOCKS = 16, 4
# A tile of a short reduction (K products per output) holds at most this many accumulators:
# 15 x 64 bytes stays under the 1 KB below which TVM's LowerTVMBuiltin puts the tile buffer on
# the stack; a larger one is a TVMBackendAllocWorkspace/Free pair in every parallel tile, as
# much as the tile's work when K is small. Long reductions keep the larger tile, where the
# allocation is amortized. Larger stack buffers are not an option: TVM's LLVM codegen aligns
# an alloca to 16 bytes, and 64-byte accesses to it split.
STACK_TILE_ACCUMULATORS = 15
SHORT_REDUCTION = 256
# Rows of a float32 or bf16 matmul's register tile, at most: each row of the tile reads its own
# row of the activation, K elements apart from the next, and past several such streams per
# tile the reduction waits on cache misses (a 15-row tile of a K=2048 matmul ran at two thirds
# of a 4-row one's rate); too few rows and each weight vector loaded from L2 feeds too few
# multiply-adds (docs/design/measurements.md, MATMUL_TILE_ROWS). A conv's tile rows are
# neighbouring pixels and keep deeper tiles. Rows that no count of 4 to 8 divides are padded
# by PrepackWeights.
MATMUL_TILE_ROWS = 8


def _packed_block(infos) -> tuple[object, DotFormat] | None:
    """(the packed reduction among the normalized blocks, its format), or None."""
    if infos is None or sum(not i.is_injective() for i in infos) != 1:
        return None
    for info in infos:
        if info.is_injective() or info.block_rv is None:
            continue
        for fmt in FORMATS:
            if _name(info).startswith(fmt.block):
                return info, fmt
    return None


def packed_format(func: tirx.PrimFunc) -> str | None:
    """The packed format of ``func``'s contraction ("int8", "bf16", "fp16", "fp32"), or None
    when it is not a packed kernel."""
    try:
        found = _packed_block(normalize_prim_func(s_tir.Schedule(func)))
    except (ScheduleError, ValueError):
        return None
    return None if found is None else found[1].name


# Weights up to this size are read whole by every thread (pixels first); half of a 2 MB L2
_PIXELS_FIRST_WEIGHT_BYTES = 1 << 20


@dataclass
class _DotKernel:
    """What PackedDot decided about one kernel before tiling it: its format and the
    instruction it is tensorized onto (INTRINSICS), the target's float32 lanes and vector
    registers (and whether a broadcast needs one of its own), whether decisions are sampled
    (tuning), the parallel order (None: by weight size, pixels_first) and the accumulator
    cap (None: registers decide)."""
    fmt: DotFormat
    intrinsic: tuple
    lanes: int
    registers: int
    broadcast_register: bool = False
    tunable: bool = False
    pixels: bool | None = None
    accumulators: int | None = None
    guarded_taps: bool = False  # reads its zero padding through guards (inline_padding)


def pixels_first(sch, block, fmt: DotFormat) -> bool:
    """Whether the parallel tiles go over output pixels first and channel blocks inside them
    (each thread: a band of the image, every channel, all the weights) rather than channel
    blocks first (each thread: its share of the channels, every pixel, its share of the
    weights). Pixels first where the weights fit in half of L2: the next layer then reads the
    band this core wrote, from its own cache. Channels first where the weights are large:
    every thread reading all of them costs more than the locality gains."""
    return _weight_bytes(sch, block, fmt) <= _PIXELS_FIRST_WEIGHT_BYTES


def _packed_weight(sch, block, fmt: DotFormat):
    """The packed weight buffer the reduction block reads (static shape [..., lanes, group]),
    or None."""
    for region in sch.get(block).reads:
        if not all(isinstance(d, tirx.IntImm) for d in region.source.shape):
            continue  # the activation, of a symbolic row count
        shape = [int(d) for d in region.source.shape]
        if len(shape) >= 3 and shape[-2:] == [fmt.lanes, fmt.group]:
            return region.source
    return None


def _weight_bytes(sch, block, fmt: DotFormat) -> int:
    """Bytes of the packed weight the reduction block reads."""
    weight = _packed_weight(sch, block, fmt)
    if weight is None:
        return 0
    return math.prod(int(d) for d in weight.shape) * weight.dtype.bits // 8


def _packed_matmul(sch, block, fmt: DotFormat) -> bool:
    """Whether the reduction block reads a packed matmul weight ([N/L, K/G, L, G]; a conv's
    is [OC/L, KH, KW, IC/G, L, G], a Winograd product's [positions, N/L, K, L, 1])."""
    weight = _packed_weight(sch, block, fmt)
    return weight is not None and len(weight.shape) == 4


def _inline_side_input(sch, producer, main) -> bool:
    """Inline a producer that the contraction does not read (an elementwise computation of an
    epilogue's other input: the residual add's ``dequantize(xq)``, ResidualFromQuantized)
    into its reader. Scheduled on its own it would be one more pass over the tensor."""
    written = [region.source for region in sch.get(producer.block_rv).writes]
    reads = [region.source for region in sch.get(main.block_rv).reads]
    if any(w.same_as(r) for w in written for r in reads):
        return False
    try:
        sch.compute_inline(producer.block_rv)
    except ScheduleError:
        return False
    return True


def _rows_static(sch, main) -> bool:
    """Whether the tile's row axis is static (a symbolic row count arrives as symbolic blocks
    of SYMBOLIC_ROWS static rows: PrepackWeights)."""
    spatial = [loop for loop, k in zip(sch.get_loops(main.block_rv), main.dom_kind()) if k == "S"]
    return len(spatial) < 2 or _extent(sch, spatial[-2]) is not None


def _name(info) -> str:
    return info.name or ""


# A step of a register tile of R rows and V channel blocks issues R*V multiply-adds, and where
# the broadcast takes a register of its own (broadcast_register) R broadcasts and V weight
# loads besides; each of those costs about this share of a multiply-add's issue slots (fitted
# on AVX2 conv and matmul kernels of ResNet-50's shapes: docs/design/measurements.md).
_LOAD_COST = 0.35


def _tile_merit(tile: tuple[int, int], broadcast_register: bool) -> float:
    """How tile_shape ranks a tile: its multiply-adds' share of the tile's instructions where
    the broadcast needs a register, else its accumulator count."""
    rows, blocks = tile
    if broadcast_register:
        return rows * blocks / (rows * blocks + _LOAD_COST * (rows + blocks))
    return rows * blocks


def _tile_with_broadcast_register(channel_blocks: int, rows: int, registers: int,
                                  accumulators: int | None, max_rows: int) -> tuple[int, int]:
    """tile_shape where the broadcast activation needs a register: R*V accumulators, V weight
    vectors, the broadcast and one spare fit the register file (with no spare, LLVM kept an
    accumulator on the stack: a store and a load every step), and among those tiles the one
    whose multiply-adds are the largest share of its instructions. That share, not the
    accumulator count, decides: a 14x1 tile (one multiply-add per broadcast) ran slower than
    a 4x2 one. Ties go to more rows (each weight vector reused more)."""
    best, best_share = (1, 1), 0.0
    for blocks in range(1, _MAX_CHANNEL_BLOCKS + 1):
        if channel_blocks % blocks:
            continue
        for r in range(1, min(rows, max_rows) + 1):
            if rows % r or r * blocks + blocks + 2 > registers:
                continue
            if accumulators is not None and r * blocks > max(accumulators, blocks):
                continue
            share = _tile_merit((r, blocks), broadcast_register=True)
            if share > best_share + 1e-9 or (abs(share - best_share) <= 1e-9 and r > best[0]):
                best, best_share = (r, blocks), share
    return best


def tile_shape(channel_blocks: int, rows: int, registers: int = 32,
               accumulators: int | None = None, max_rows: int = _MAX_ROWS,
               broadcast_register: bool = False) -> tuple[int, int]:
    """(rows R, channel blocks V) of the register tile: the most accumulators R*V that leave
    V registers for the weight vectors (R*V + V <= ``registers``; the activation broadcasts
    fold into the multiply-adds' memory operands), with V up to 4 blocks of channels and R up
    to ``max_rows`` (16) rows, each dividing its axis; R*V at most ``accumulators`` when given
    (guarded taps: cpu_contraction.GUARDED_TILE_ACCUMULATORS). Ties go to more than one block
    (with one, every broadcast feeds a single multiply-add), then to more rows (each weight
    vector is then reused more). Rows are chosen with the blocks, not after them: taking V
    first can leave an odd row count (7) with one-row tiles. With ``broadcast_register``
    (no embedded broadcast): _tile_with_broadcast_register."""
    if broadcast_register:
        return _tile_with_broadcast_register(channel_blocks, rows, registers, accumulators,
                                             max_rows)
    best = (1, 1)
    for blocks in range(1, _MAX_CHANNEL_BLOCKS + 1):
        if channel_blocks % blocks:
            continue
        limit = min(max_rows, registers // blocks - 1)
        if accumulators is not None:
            limit = min(limit, max(1, accumulators // blocks))
        r = _largest_divisor(rows, limit)
        if (r * blocks, blocks > 1, r) > (best[0] * best[1], best[1] > 1, best[0]):
            best = (r, blocks)
    return best


def packed_matmul_tile_merit(rows: int, reduction: int, registers: int,
                             broadcast_register: bool, symbolic_rows: bool = False
                             ) -> Callable[[int], float]:
    """The merit (_tile_merit) of the register tile PackedDot gives a float32 packed matmul, as
    a function of its count of column blocks: ``rows`` along the tile's row axis (a block of
    padded rows where they are symbolic), ``reduction`` products per output, the target's
    vector ``registers``. PrepackWeights picks the count of blocks by it
    (dot_kernels.packed_blocks)."""
    accumulators = STACK_TILE_ACCUMULATORS \
        if reduction <= SHORT_REDUCTION or symbolic_rows else None

    def merit(blocks: int) -> float:
        return _tile_merit(tile_shape(blocks, rows, registers, accumulators, MATMUL_TILE_ROWS,
                                      broadcast_register), broadcast_register)
    return merit


# Steps of a float32 matmul's reduction unrolled around its register tile (untuned schedule):
# one loop branch and pointer update per this many steps of the tile's multiply-adds. Fewer
# or many more ran slower (docs/design/measurements.md, MATMUL_K_UNROLL). Convs keep their
# loop: MobileNetV3's short 1x1 convs ran slower unrolled.
MATMUL_K_UNROLL = 8


def _unrolled_reduction(sch, block, fmt: DotFormat, reduce_outer, kernel: _DotKernel):
    """(the reduction loop, the steps unrolled inside it or None): MATMUL_K_UNROLL steps of a
    float32 packed matmul whose reduction they divide. Not where the schedule is traced for
    tuning (schedules/space.py): the design space, and the records tuned in it, stay as
    they were."""
    extent = _extent(sch, reduce_outer)
    if kernel.tunable or fmt.name != "fp32" or not _packed_matmul(sch, block, fmt) or \
            extent is None or extent % MATMUL_K_UNROLL or extent <= MATMUL_K_UNROLL:
        return reduce_outer, None
    return tuple(sch.split(reduce_outer, factors=[None, MATMUL_K_UNROLL]))


class PackedDot(CpuRule):
    """Tensorized schedule of the packed contraction kernels (their pad, crop and epilogue)."""

    needs_reduction = True

    def schedule(self, sch: s_tir.Schedule, target: Target, tunable: bool = False,
                 pixels: bool | None = None):
        """Schedule ``sch``'s main in place (``sch`` may be MetaSchedule's traced schedule:
        schedules/space.py); None when it is not a packed kernel or the target lacks its
        format's instruction. With ``tunable``, the tile's rows and channel blocks are sampled
        decisions whose defaults are the untuned choices. ``pixels`` fixes the order of the
        parallel tiles (``pixels_first``'s choice when None): a structural choice, so the
        tuner gets one design space for each order."""
        infos = normalize_prim_func(sch)
        found = _packed_block(infos)
        if found is None:
            return None
        main, fmt = found
        intrinsic = INTRINSICS.get((fmt.name, _INSTRUCTIONS[fmt.name](target) or ""))
        if intrinsic is None or not _rows_static(sch, main):
            return None
        # Float32 kernels of a short reduction (the 3-channel stem) read their zero padding
        # through guards, as depthwise ones do: the padded copy of a 3-channel image is a
        # scalar loop. The tile is capped as guarded depthwise tiles are (the spills of
        # cpu_contraction.GUARDED_TILE_ACCUMULATORS). A tensorized tile (int8 on VNNI, bf16)
        # cannot take guarded loads; a long reduction keeps its padded copy (no gain).
        accumulators, guarded = None, False
        if intrinsic[0] is None and inline_padding(sch, main, infos):
            infos = normalize_prim_func(sch)
            main, fmt = _packed_block(infos)
            accumulators, guarded = GUARDED_TILE_ACCUMULATORS, True
        if accumulators is None and _reduction_length(sch, main) <= SHORT_REDUCTION:
            accumulators = STACK_TILE_ACCUMULATORS
        for producer in infos[:infos.index(main)]:
            if _name(producer) == CLAMPED_ROWS_BLOCK:  # read in place: no copy of the rows
                sch.compute_inline(producer.block_rv)
                infos = normalize_prim_func(sch)
                main, fmt = _packed_block(infos)
                break
        index = infos.index(main)
        lanes = vector_lanes(target, 32)
        operand_bits = {"uint8": 8, "uint16": 16, "float16": 16}.get(fmt.operand, 32)
        for producer in infos[:index]:
            if not _inline_side_input(sch, producer, main):
                schedule_injective_block(sch, producer.block_rv,
                                         vector_lanes(target, operand_bits))
        kernel = _DotKernel(fmt, intrinsic, lanes, simd(target)[1], broadcast_register(target),
                            tunable, pixels, accumulators, guarded)
        amx = _amx_tile(sch, main, fmt) if (fmt.name == "bf16" and amx_bf16(target)) or \
            (fmt.name == "int8" and amx_int8(target)) else None
        if amx is not None:
            _schedule_amx(sch, main, infos[index + 1:], kernel, amx)
        else:
            self._schedule_main(sch, main, infos[index + 1:], kernel)
        return sch

    @staticmethod
    def _tile(sch, channel_blocks: int, rows: int, kernel: _DotKernel,
              accumulators: int | None = None, max_rows: int = _MAX_ROWS):
        """(rows, channel blocks): tile_shape's, or (kernel.tunable) decisions sampled
        around them."""
        default = tile_shape(channel_blocks, rows, kernel.registers, accumulators, max_rows,
                             kernel.broadcast_register)
        if not kernel.tunable:
            return default
        choices = []
        for extent, limit, chosen in ((rows, _MAX_ROWS, default[0]),
                                      (channel_blocks, _MAX_CHANNEL_BLOCKS, default[1])):
            values = [d for d in range(1, min(extent, limit) + 1) if extent % d == 0]
            choices.append(sch.sample_categorical(values, [1 / len(values)] * len(values),
                                                  decision=values.index(chosen)))
        return tuple(choices)

    def _schedule_main(self, sch, main, epilogues, kernel: _DotKernel) -> None:
        fmt, lanes, accumulators = kernel.fmt, kernel.lanes, kernel.accumulators
        block = main.block_rv
        loops = sch.get_loops(block)
        kinds = main.dom_kind()
        spatial = [loop for loop, k in zip(loops, kinds) if k == "S"]
        reduce = [loop for loop, k in zip(loops, kinds) if k == "R"]
        if len(spatial) < 2:  # one output row (unit axes are dropped): a new unit row axis
            spatial.insert(0, sch.add_unit_loop(spatial[0]))
        merged_width = None
        if len(spatial) >= 3 and not kernel.guarded_taps and \
                not (fmt.name in ("fp32", "bf16") and _packed_matmul(sch, block, fmt)):
            # a conv: its tile rows may run on across the output's rows
            merged_width = _rows_across_image_rows(sch, block, spatial, fmt, kernel)
            if merged_width is not None:
                loops = sch.get_loops(block)
                kinds = ["R" if iv.iter_type == tirx.IterVar.CommReduce else "S"
                         for iv in sch.get(block).iter_vars]
                spatial = [loop for loop, k in zip(loops, kinds) if k == "S"]
                reduce = [loop for loop, k in zip(loops, kinds) if k == "R"]
        channel_outer, channel_lane = sch.split(spatial[-1], factors=[None, fmt.lanes])
        # one product per lane (float32): no group loop, the lane loop is vectorized instead
        reduce_outer, reduce_group = sch.split(reduce[-1], factors=[None, fmt.group]) \
            if fmt.group > 1 else (reduce[-1], None)
        if any(_extent(sch, loop) is None for loop in spatial[:-2]):
            # Symbolic outer axes (blocks of a sequence's rows): a tile buffer small enough
            # for the stack. In a workspace buffer LLVM kept these tiles' accumulators in
            # memory, a store per multiply-add (it does not where the shapes are static).
            accumulators = min(accumulators or STACK_TILE_ACCUMULATORS, STACK_TILE_ACCUMULATORS)
        # A matmul's tile rows are rows of its activation, each a stream of its own K-long
        # row; a conv's are neighbouring pixels (NHWC).
        row_extent = _extent(sch, spatial[-2])
        max_rows = _MAX_ROWS
        if fmt.name in ("fp32", "bf16") and _packed_matmul(sch, block, fmt):
            max_rows = MATMUL_TILE_ROWS
        rows, blocks = self._tile(sch, _extent(sch, channel_outer), row_extent, kernel,
                                  accumulators, max_rows)
        row_out, row_in = sch.split(spatial[-2], factors=[None, rows])
        block_out, block_in = sch.split(channel_outer, factors=[None, blocks])
        outer = spatial[:-2]
        pixels = kernel.pixels if kernel.pixels is not None else pixels_first(sch, block, fmt)
        order = [*outer, row_out, block_out] if pixels else [block_out, *outer, row_out]
        reduce_outer, k_inner = _unrolled_reduction(sch, block, fmt, reduce_outer, kernel)
        sch.reorder(*order, *reduce[:-1], reduce_outer, *([k_inner] if k_inner else []),
                    row_in, block_in, channel_lane,
                    *([reduce_group] if reduce_group is not None else []))
        tile = sch.fuse(*order)
        sch.parallel(tile)
        name, llvm_ir = kernel.intrinsic
        if llvm_ir:  # the function the intrinsic calls, linked into this kernel's module
            sch.annotate(tile, "pragma_import_llvm", llvm_ir)
        # accumulators in a small tile buffer, epilogue applied on the way out (as Contraction)
        write_back = sch.cache_write(block, 0, "global")
        if merged_width is not None:
            # the tile buffer over fused pixels: a tile's rows are then neighbours in it, at
            # constant offsets once unrolled, and LLVM keeps them in registers (indexed by
            # height and width, a tile that wraps to the next row was kept in memory)
            rank = len(sch.get(block).writes[0].region)
            sch.transform_layout(block, ("write", 0),
                                 _fused_pixels(rank, rank - 3, merged_width,
                                               _index_dtype(sch, block)))
        crop = epilogues[0].block_rv if epilogues and _name(epilogues[0]).startswith(
            CROP_BLOCK) else None
        if crop is None:
            Contraction._inline_epilogues(sch, write_back, epilogues, lanes)
        else:
            # Output channels or rows padded to whole blocks: the tile writes the padded
            # accumulator and the crop (epilogue inlined into it) runs over the real ones,
            # right after each tile where it reads the tile's rows by plain index
            # (_crop_per_tile), else as a pass of its own. Merged into the write-back, it ran
            # over the padded extent: past the output (Contraction._same_output_shape;
            # tests/quantize/test_int8_kernels.py).
            Contraction._inline_epilogues(sch, crop, epilogues[1:], lanes)
        if merged_width is not None:
            # written pixel by fused pixel too: by height and width, the tile's region was
            # the rectangle around a tile that wraps to the next row
            rank = len(sch.get(write_back).iter_vars)
            sch.transform_block_layout(write_back, _fused_pixels(
                rank, rank - 3, merged_width, _index_dtype(sch, write_back)))
        sch.reverse_compute_at(write_back, tile, preserve_unit_loops=True)
        _vectorize_write_back(sch, write_back, lanes)
        # over fused pixels a tile may wrap to the next output row: the crop's region under it
        # would be the rectangle around the tile, pixels other tasks write
        _schedule_crop(sch, crop, tile, lanes, per_tile=merged_width is None)
        if name is None:  # before decomposing: the update block is then no reduction block
            sch.vectorize(channel_lane)
        init = sch.decompose_reduction(block, reduce[0] if len(reduce) > 1 else reduce_outer)
        sch.vectorize(sch.get_loops(init)[-1])
        if name is not None:
            sch.tensorize(channel_lane, name)
        sch.unroll(row_in)
        sch.unroll(block_in)
        if k_inner is not None:
            sch.unroll(k_inner)


# An AMX tile of sums has at most 16 rows; fewer than this many leave most of each tile
# multiply idle, and the kernel keeps its vector form (ConvertBF16 pads matmul rows for AMX).
# 7 keeps the 7x7 stage of 224-pixel CNNs on AMX: its tiles of 7 pixels ran at 4-5 times the
# vector kernel's rate (docs/design/measurements.md).
AMX_MIN_ROWS = 7
# the shortest reduction step worth a tile load, in bytes of a tile row (bf16: 8 values,
# int8: 16; a row holds 64)
AMX_MIN_STEP_BYTES = 16


@dataclass(frozen=True)
class _AmxTile:
    """An AMX tile of a packed bf16 or int8 kernel (``kind``): ``a_tiles`` x ``rows`` output
    rows (a matmul's rows, a conv's neighbouring pixels of one output row), ``b_tiles`` blocks
    of 16 columns, ``step`` values of the reduction per tile load; a conv's taps, stride and
    dilation (None for a matmul)."""
    kind: str
    rows: int
    a_tiles: int
    b_tiles: int
    step: int
    reduction: int            # a matmul's K, a conv's input channels
    conv: tuple | None = None  # (kh, kw, stride, dilation h, dilation w)
    merged: bool = False      # a conv's taps along a row summed with their channels
    # column tiles one intrinsic call computes (one tile configuration load for all), and a
    # matmul's K block they take turns on (_column_groups)
    column_group: int = 1
    k_block: int = 0
    # a conv over the flattened padded image (dot_kernels.conv2d_flat): positions a row of
    # taps on (amx_intrinsics.register_conv); 0 for one over the image's rows
    row_step: int = 0

    def intrinsic(self) -> str:
        if self.conv is None:
            return amx_intrinsics.register(self.kind, self.rows, self.a_tiles, self.b_tiles,
                                           self.reduction, self.step, self.column_group,
                                           self.k_block)
        return amx_intrinsics.register_conv(self.kind, self.rows, self.a_tiles, self.b_tiles,
                                            *self.conv, self.reduction, self.step, self.merged,
                                            self.column_group, self.row_step)


def _coefficient(expr, var) -> int | None:
    """The constant coefficient of ``var`` in the affine ``expr`` (0 where it is absent)."""
    found = tvm_arith.detect_linear_equation(expr, [var])
    if len(found) != 2 or not isinstance(found[0], tirx.IntImm):
        return None
    return int(found[0])


def _buffer_loads(expr) -> list:
    """The buffer loads (``TensorLoad``) of a TIR expression: arithmetic, casts, calls,
    selects."""
    if isinstance(expr, tvm_ir.expr.TensorLoad):
        return [expr]
    children = list(expr.args) if isinstance(expr, tvm_ir.expr.Call) else [
        getattr(expr, name) for name in ("a", "b", "value", "condition", "true_value",
                                         "false_value") if hasattr(expr, name)]
    return [load for child in children if isinstance(child, tvm_ir.expr.Expr)
            for load in _buffer_loads(child)]


def _conv_geometry(sch, block, weight) -> tuple | None:
    """(kh, kw, stride, dilation h, dilation w, row step) of a packed conv2d (NHWC, one group)
    read from its activation access, or None where the access is not of that form (a grouped
    conv's channel index, a strided height only). An activation of three axes, [N, positions,
    channels], is dot_kernels.conv2d_flat's flattened padded image: stride 1, dilation h 0,
    tap row ``th`` reading ``th * row step`` positions on; the row step is 0 otherwise."""
    kh, kw = int(weight.shape[1]), int(weight.shape[2])
    stmt = sch.get(block)
    spatial = [iv.var for iv in stmt.iter_vars if iv.iter_type != tirx.IterVar.CommReduce]
    reduce = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(reduce) != (kh > 1) + (kw > 1) + 1 or len(spatial) < 2:
        return None
    rh = reduce[0] if kh > 1 else None
    rw = reduce[int(kh > 1)] if kw > 1 else None
    output = stmt.writes[0].source
    loads = [load for load in _buffer_loads(stmt.body.value)
             if not load.source.same_as(weight) and not load.source.same_as(output)]
    if len(loads) != 1 or len(loads[0].indices) < 3:
        return None
    flat = len(loads[0].indices) == 3
    *_, height, width, channel = loads[0].indices
    if not (isinstance(channel, tirx.Var) and channel.same_as(reduce[-1])):
        return None
    stride = _coefficient(width, spatial[-2])
    dw = _coefficient(width, rw) if rw is not None else 1
    if flat:
        row_step = _coefficient(width, rh) if rh is not None else 0
        if stride != 1 or not dw or row_step is None or (rh is not None and row_step <= 0):
            return None
        return kh, kw, 1, 0, dw, row_step
    dh = _coefficient(height, rh) if rh is not None else 1
    if not stride or not dw or not dh:
        return None
    return kh, kw, stride, dh, dw, 0


def amx_min_step(kind: str) -> int:
    """The shortest reduction step of an AMX tile of format ``kind``, in values."""
    return AMX_MIN_STEP_BYTES // amx_intrinsics.KINDS[kind].value_bytes


def _amx_tile(sch, main, fmt: DotFormat) -> _AmxTile | None:
    """The AMX tile of a packed bf16 or int8 matmul or conv (amx_intrinsics), or None where
    its static shape has none: rows a tile of AMX_MIN_ROWS to 16 divides (a conv's: its output
    width), a reduction a step of amx_min_step values or more divides."""
    weight = _packed_weight(sch, main.block_rv, fmt)
    if weight is None or len(weight.shape) not in (4, 6):
        return None
    loops = sch.get_loops(main.block_rv)
    kinds = main.dom_kind()
    spatial = [_extent(sch, loop) for loop, k in zip(loops, kinds) if k == "S"]
    reduce = [_extent(sch, loop) for loop, k in zip(loops, kinds) if k == "R"]
    # the tile's rows, columns and reduction static; outer axes may be symbolic (blocks of a
    # sequence's rows: PrepackWeights)
    if None in spatial[-2:] or None in reduce:
        return None
    conv, row_step = None, 0
    if len(weight.shape) == 6:
        geometry = _conv_geometry(sch, main.block_rv, weight)
        if geometry is None:
            return None
        *conv, row_step = geometry
        conv = tuple(conv)
    elif len(reduce) != 1:
        return None
    rows = spatial[-2] if len(spatial) >= 2 else 1
    channels, k = spatial[-1], reduce[-1]
    tile_rows = _largest_divisor(rows, amx_intrinsics.TILE_ROWS)
    step = amx_intrinsics.step(fmt.name, k)
    merged = False
    if conv is not None and step < amx_min_step(fmt.name) and conv[4] == 1 and \
            _activation_channels(sch, main.block_rv, weight) == k:
        # a few channels (an image's): a row's taps and channels as one reduction
        step, merged = amx_intrinsics.step(fmt.name, conv[1] * k), True
    if tile_rows < AMX_MIN_ROWS or step < amx_min_step(fmt.name) or \
            channels % amx_intrinsics.LANES:
        return None
    a_tiles = 2 if rows % (2 * tile_rows) == 0 else 1
    b_tiles = amx_intrinsics.b_tiles(channels)
    group, k_block = _column_groups(k, step, channels // (b_tiles * amx_intrinsics.LANES),
                                    conv is not None)
    return _AmxTile(fmt.name, tile_rows, a_tiles, b_tiles, step, k, conv, merged, group,
                    k_block, row_step)


# Column tiles of one intrinsic call, at most: the tile configuration (ldtilecfg) is loaded once
# a call, and loaded once per tile it was a large share of a short-K matmul's time. A matmul of
# a short reduction (K up to AMX_SHORT_K) has its group's tiles take turns on blocks of
# AMX_K_BLOCK values of K, so that the rows' block of the activation stays in L1 (each tile
# read all of it from L2 before). A long reduction ran slower blocked, and its tiles each
# take all of K, one call each. Figures: docs/design/measurements.md (amx_intrinsics.py).
AMX_COLUMN_GROUP = 4
AMX_SHORT_K = 1024
AMX_K_BLOCK = 256


def _column_groups(k: int, step: int, column_tiles: int, conv: bool) -> tuple[int, int]:
    """(column tiles a call, K block: 0 for all of K) of an AMX kernel (AMX_COLUMN_GROUP)."""
    if not conv and k > AMX_SHORT_K:
        return 1, 0
    group = _largest_divisor(column_tiles, AMX_COLUMN_GROUP)
    if conv or k <= AMX_K_BLOCK or k % AMX_K_BLOCK or AMX_K_BLOCK % step:
        return group, 0
    return group, AMX_K_BLOCK


def _activation_channels(sch, block, weight) -> int | None:
    """The channel extent of the activation buffer a conv reads (its last axis)."""
    output = sch.get(block).writes[0].source
    for region in sch.get(block).reads:
        if not region.source.same_as(weight) and not region.source.same_as(output):
            last = region.source.shape[-1]
            return int(last) if isinstance(last, tirx.IntImm) else None
    return None


# The weight panels of an AMX matmul's column blocks that one group holds, at most: the group
# stays in L2 (half of a 2 MB L2) while each tile of activation rows passes over all of it.
AMX_PANEL_GROUP_BYTES = 1 << 20


def _amx_column_group(tile: _AmxTile, row_tiles: int | None, column_blocks: int | None
                      ) -> int | None:
    """Column blocks of an AMX matmul that each tile of rows takes in turn, the group's weight
    panels in L2 (AMX_PANEL_GROUP_BYTES), before the next group starts; None where the rows'
    activation fits that budget whole (column block by column block, it stays in L2). Over
    all the rows for each column block, a long activation (Whisper's 1,500 frames by 2,048
    channels, 6 MB of bf16) was read again from L3 for every block of columns. The group
    divides the blocks: split unevenly, the tile's block would need a guard, and tensorize
    takes none."""
    if tile.conv is not None or row_tiles is None or column_blocks is None:
        return None
    value_bytes = amx_intrinsics.KINDS[tile.kind].value_bytes
    rows_bytes = row_tiles * tile.a_tiles * tile.rows * tile.reduction * value_bytes
    panel = tile.column_group * tile.b_tiles * amx_intrinsics.LANES * tile.reduction * \
        value_bytes
    if rows_bytes <= AMX_PANEL_GROUP_BYTES:
        return None
    return max((g for g in range(2, column_blocks) if column_blocks % g == 0 and
                g * panel <= AMX_PANEL_GROUP_BYTES), default=None)


def _schedule_amx(sch, main, epilogues, kernel: _DotKernel, tile: _AmxTile) -> None:
    """A packed bf16 or int8 matmul or conv on AMX tiles: parallel tiles of up to 2 x 16 rows
    and a group of 2 x 16-column tiles, each one tensor intrinsic (amx_intrinsics) over the
    whole reduction, its sums stored to the tile buffer and the epilogue applied from there,
    as in _schedule_main."""
    name = tile.intrinsic()
    x86.request_amx()  # kernels may run in this process (constant folding, tests)
    block = main.block_rv
    loops = sch.get_loops(block)
    kinds = main.dom_kind()
    spatial = [loop for loop, kd in zip(loops, kinds) if kd == "S"]
    reduce = [loop for loop, kd in zip(loops, kinds) if kd == "R"]
    if len(spatial) < 2:
        spatial.insert(0, sch.add_unit_loop(spatial[0]))
    block_out, columns = sch.split(spatial[-1], factors=[
        None, tile.column_group * tile.b_tiles * amx_intrinsics.LANES])
    row_out, row_in = sch.split(spatial[-2], factors=[None, tile.a_tiles * tile.rows])
    outer = spatial[:-2]
    pixels = kernel.pixels if kernel.pixels is not None else pixels_first(sch, block, kernel.fmt)
    order = [*outer, row_out, block_out] if pixels else [block_out, *outer, row_out]
    group = None if pixels else _amx_column_group(tile, _extent(sch, row_out),
                                                  _extent(sch, block_out))
    if group is not None:
        block_group, block_out = sch.split(block_out, factors=[None, group])
        order = [block_group, *outer, row_out, block_out]
    sch.reorder(*order, row_in, columns, *reduce)
    fused = sch.fuse(*order)
    sch.parallel(fused)
    write_back = sch.cache_write(block, 0, "global")
    crop = epilogues[0].block_rv if epilogues and _name(epilogues[0]).startswith(
        CROP_BLOCK) else None
    if crop is None:
        Contraction._inline_epilogues(sch, write_back, epilogues, kernel.lanes)
    else:
        Contraction._inline_epilogues(sch, crop, epilogues[1:], kernel.lanes)
    sch.reverse_compute_at(write_back, fused, preserve_unit_loops=True)
    _vectorize_write_back(sch, write_back, kernel.lanes)
    _schedule_crop(sch, crop, fused, kernel.lanes)
    sch.tensorize(row_in, name)  # init included: the tiles start from zero


# Fused pixels only for a tile that ranks this much higher: on AVX2, 2x2 -> 4x2 ranks 7%
# higher and is; 4x2 -> 6x2 ranks 2% higher, which tile-shape trials did not resolve, and
# would change the schedule of every conv whose rows already tile well
# (docs/design/measurements.md).
_MERGED_ROWS_GAIN = 1.05


def _rows_across_image_rows(sch, block, spatial: list, fmt: DotFormat,
                            kernel: _DotKernel) -> int | None:
    """Where the tile tile_shape finds for the H*W pixels of a conv's output ranks well
    above the one for a row of W pixels (_MERGED_ROWS_GAIN): the block re-indexed over fused
    pixels (its height and width axes become one, h * W + w), and W returned; else None,
    nothing changed.
    Tile rows must divide their axis, and a width with few divisors (14 and 7, the late
    stages of 224-pixel networks) left small tiles: 2 pixels x 2 blocks for 112 channels of a
    14x14 output on AVX2; over the 196 pixels of the image the tile takes 4. A tile's pixels
    may then wrap to the next output row: their input rows are found once a tile, outside
    the reduction. The block itself is re-indexed, not just its loops fused: indexed by
    height and width, the tile's write-back covered the rectangle around a wrapping tile."""
    extents = [_extent(sch, loop) for loop in spatial]
    if any(e is None for e in extents) or extents[-3] == 1 or extents[-1] % fmt.lanes:
        return None
    height, width = extents[-3:-1]
    channel_blocks = extents[-1] // fmt.lanes
    default = tile_shape(channel_blocks, width, kernel.registers, kernel.accumulators,
                         _MAX_ROWS, kernel.broadcast_register)
    merged = tile_shape(channel_blocks, height * width, kernel.registers, kernel.accumulators,
                        _MAX_ROWS, kernel.broadcast_register)
    if _tile_merit(merged, kernel.broadcast_register) < \
            _MERGED_ROWS_GAIN * _tile_merit(default, kernel.broadcast_register):
        return None
    loops = [sch.get(loop) for loop in sch.get_loops(block)]
    h_at = next(k for k, loop in enumerate(loops) if loop.same_as(sch.get(spatial[-3])))
    if not loops[h_at + 1].same_as(sch.get(spatial[-2])):
        return None  # height and width not neighbours among the block's axes
    sch.transform_block_layout(block, _fused_pixels(len(loops), h_at, width,
                                                    _index_dtype(sch, block)))
    return width


def _fused_pixels(rank: int, at: int, width: int, dtype: str) -> tirx.IndexMap:
    """(..., h, w, ...) -> (..., h * width + w, ...) for axes ``at`` and ``at + 1`` of
    ``rank``, in ``dtype`` (the kernel's index type: a map in another one is refused)."""
    def fused(*index):
        merged = index[at] * tirx.const(width, dtype) + index[at + 1]
        return (*index[:at], merged, *index[at + 2:])
    return tirx.IndexMap.from_func(fused, ndim=rank, index_dtype=dtype)


def _index_dtype(sch, block) -> str:
    return str(sch.get(block).iter_vars[0].var.ty.dtype)


def _reads_by_plain_index(sch: s_tir.Schedule, block) -> bool:
    """Whether ``block`` reads every buffer at its own block variables or constants, no
    arithmetic: only then can reverse_compute_at bound its region to one tile's. Rows of
    several padded blocks, read at i // R and i % R, came out as all the rows for every tile;
    flattened rows given their axes back (read at i * W + j: dot_kernels' out_lead) came out
    as a region that missed rows, and the kernel computed wrong values."""
    for region in sch.get(block).reads:
        for axis in region.region:
            if not isinstance(axis.min, (tirx.Var, tirx.IntImm)):
                return False
    return True


def _schedule_crop(sch: s_tir.Schedule, crop, tile_loop, lanes: int,
                   per_tile: bool = True) -> None:
    """The crop block of a packed kernel (None: it has none), its epilogue inlined: right after
    each tile (_crop_per_tile) where ``per_tile`` allows and it reads at plain indices
    (_reads_by_plain_index), else as a pass of its own over the whole output."""
    if crop is None:
        return
    if per_tile and _reads_by_plain_index(sch, crop):
        _crop_per_tile(sch, crop, tile_loop, lanes)
    else:
        schedule_injective_block(sch, crop, lanes)


def _crop_per_tile(sch: s_tir.Schedule, crop, tile_loop, lanes: int) -> None:
    """The crop (its epilogue inlined) right after each tile, over the tile's real rows and
    columns (a predicate keeps it inside the output), while they are in cache. As a pass of
    its own over the whole output it read the padded sums back from memory: ViT's GELU
    epilogue after its first FFN matmul (197 rows padded to 224) ran there
    (docs/design/measurements.md)."""
    sch.reverse_compute_at(crop, tile_loop, preserve_unit_loops=True)
    loop = sch.get_loops(crop)[-1]
    extent = _extent(sch, loop)
    if extent and extent % lanes == 0:
        _, inner = sch.split(loop, factors=[None, lanes])
        sch.vectorize(inner)


def _vectorize_write_back(sch: s_tir.Schedule, write_back, lanes: int) -> None:
    """Vectorize the tile's write-back; one accumulator vector at a time where it writes
    integers narrower than the accumulators: a wider narrowing write-back has LLVM rebuild
    the per-channel bias vector lane by lane on every row (vpinsrd from the stack)."""
    loop = sch.get_loops(write_back)[-1]
    dtype = sch.get(write_back).writes[0].source.dtype
    extent = _extent(sch, loop)
    if (str(dtype).startswith(("int", "uint")) and int(dtype.bits) < 32 and extent
            and extent > lanes and extent % lanes == 0):
        outer, loop = sch.split(loop, factors=[None, lanes])
        sch.unroll(outer)
    sch.vectorize(loop)


def _reduction_length(sch: s_tir.Schedule, main) -> int:
    """Products summed per output of the contraction (the product of its reduction extents;
    a symbolic one counts as long)."""
    length = 1
    for loop, kind in zip(sch.get_loops(main.block_rv), main.dom_kind()):
        if kind == "R":
            extent = _extent(sch, loop)
            if extent is None:
                return 1 << 30
            length *= extent
    return length
