"""Default (untuned) CPU schedules, written as dlight schedule rules.

Why our own: TVM 0.27's CPU pipeline leaves conv2d and matmul as naive loop nests (ResNet-18 ran
134x slower than onnxruntime here). These rules give every kernel a parallel, vectorized,
register-blocked schedule without any measurement, so that a compile is fast and deterministic.

Rules are tried in order; the first that accepts a PrimFunc schedules it:
  1. ``Contraction``: one multiply-accumulate reduction (conv2d in NHWC/HWIO, matmul, batch
     matmul) with injective producers and epilogues. Register-blocks the two innermost output
     axes, vectorizes the innermost (which is contiguous in the output and in the weight).
  2. ``RowReduction`` (dlight's CPU ``Reduction``, guarded): softmax / layer norm style row
     reductions.
  3. ``Generic``: anything else (pooling, means, elementwise, layout changes): every block is
     parallelized over its outer spatial loops and vectorized on its innermost loop when that
     loop is spatial.
Assumes the conv layout pass ran first (NHWC data, HWIO weights): then the output channel axis
is innermost in both the output and the weight, which is what ``Contraction`` vectorizes.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.s_tir.schedule import ScheduleError
from tvm.target import Target
from tvm.ir import TensorLoad as BufferLoad

# 32 zmm/ymm registers; keep a few free for the broadcast input and the weight vectors.
_MAX_ACCUMULATOR_VECTORS = 24
_MAX_ROW_BLOCK = 8
# Parallel loops shorter than this are not worth a thread-pool launch.
_MIN_PARALLEL_EXTENT = 2


def vector_lanes(target: Target, dtype_bits: int = 32) -> int:
    """Lanes of one SIMD register for the target (16 fp32 on AVX-512, 8 on AVX2)."""
    features = set(str(a) for a in target.attrs.get("mattr", []))
    mcpu = str(target.attrs.get("mcpu", ""))
    wide = "+avx512f" in features or mcpu in _AVX512_CPUS
    return (512 if wide else 256) // dtype_bits


_AVX512_CPUS = {"skylake-avx512", "cascadelake", "cooperlake", "icelake-server", "icelake-client",
                "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids", "znver4",
                "znver5"}


def _largest_divisor(extent: int, limit: int, multiple_of: int = 1) -> int:
    """Largest divisor of ``extent`` that is <= limit, preferring multiples of ``multiple_of``."""
    divisors = [d for d in range(1, min(extent, limit) + 1) if extent % d == 0]
    preferred = [d for d in divisors if d % multiple_of == 0]
    return max(preferred or divisors)


def _column_block(extent: int, lanes: int) -> int:
    """Columns per register tile: whole SIMD registers when the extent allows. MobileNetV2's
    1x1 conv to 24 channels took 2.4 ms as one 24-lane vector and under 0.42 ms as three
    8-lane ones (per-kernel timing on this machine, 2 threads)."""
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


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else None


def _tile_axes_static(info) -> bool:
    """The register tile (two innermost spatial axes) and the reduction need static extents;
    outer axes such as a symbolic batch are only fused into the parallel loop."""
    kinds, dom = info.dom_kind(), info.dom()
    spatial = [d for d, k in zip(dom, kinds) if k == "S"]
    reduce = [d for d, k in zip(dom, kinds) if k == "R"]
    return bool(spatial) and all(isinstance(d, (int, tirx.IntImm)) for d in spatial[-2:] + reduce)


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
            factor = _largest_divisor(inner_ext, lanes * 4, lanes)
            if factor > 1:
                outer, inner = sch.split(loops[-1], factors=[None, factor])
                sch.vectorize(inner)
                loops = sch.get_loops(block)[:-1]
                n_spatial = len(loops)
    outer = sch.fuse(*loops[:n_spatial]) if n_spatial > 1 else loops[0]
    ext = _extent(sch, outer)
    if ext is None or ext >= _MIN_PARALLEL_EXTENT:
        sch.parallel(outer)


# Reduction sizes up to this (depthwise 3x3 = 9 ... 7x7 = 49) read each input about once per
# output: a padded copy of the input costs as much memory traffic as the convolution itself.
_INLINE_PRODUCERS_MAX_REDUCTION = 64


def _inline_padding(sch: s_tir.Schedule, main, infos) -> bool:
    """Inline the producers (the zero-padded input copy) of a low-intensity contraction into
    it. MobileNetV2's stride-2 depthwise 3x3 over 112x112x96 spent most of its 1.24 ms (5
    GFLOP/s) writing and re-reading the padded copy; inlined, the bounds check is one scalar
    condition per vector of channels."""
    reduction = 1
    for kind, extent in zip(main.dom_kind(), main.dom()):
        if kind == "R":
            reduction *= int(extent)
    if reduction > _INLINE_PRODUCERS_MAX_REDUCTION:
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

    Attention over 197 tokens (ViT) makes a 197x197 score matrix: 197 is prime, so the
    register tile degenerated to one scalar (2.1 GFLOP/s). Masked tails (a non-dividing split)
    kept LLVM from vectorizing (3.8 GFLOP/s). pad_einsum copies the operands into buffers
    padded with zeros and the result back out: the kernel proper runs on whole tiles."""
    kinds, dom = main.dom_kind(), main.dom()
    spatial = [i for i, k in enumerate(kinds) if k == "S"]
    if len(spatial) < 2 or "R" not in kinds:
        return False
    padding = [1] * len(kinds)
    col, row = int(dom[spatial[-1]]), int(dom[spatial[-2]])
    if col > lanes and _column_block(col, lanes) < 4:
        padding[spatial[-1]] = lanes
    if row > _MAX_ROW_BLOCK and _largest_divisor(row, _MAX_ROW_BLOCK) <= 2:
        padding[spatial[-2]] = 4
    if padding == [1] * len(kinds):
        return False
    sch.pad_einsum(main.block_rv, padding)
    return True


def _parallelize_outer(sch: s_tir.Schedule, block) -> None:
    """Parallel over the block's fused loops, nothing vectorized."""
    loops = sch.get_loops(block)
    sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])


class Contraction(ScheduleRule):
    """Register-blocked, vectorized schedule for conv2d (NHWC/HWIO), matmul and batch matmul."""

    def apply(self, func, target: Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = [i for i in infos if not i.is_injective()]
        if len(reductions) != 1 or not _is_multiply_accumulate(sch.get(reductions[0].block_rv)):
            return None
        main = reductions[0]
        if not _tile_axes_static(main):
            return None  # symbolic tile or reduction extents go to the generic rule
        lanes = vector_lanes(target, sch.get(main.block_rv).writes[0].source.dtype.bits)
        if _inline_padding(sch, main, infos):
            infos = normalize_prim_func(sch)
            main = next(i for i in infos if not i.is_injective())
        padded = _pad_ragged_tile(sch, main, lanes)
        if padded:
            infos = normalize_prim_func(sch)
            main = next(i for i in infos if not i.is_injective())
        main_index = infos.index(main)
        for producer in infos[:main_index]:
            if padded:  # guarded copies (if_then_else on the padded axis): not vectorized
                _parallelize_outer(sch, producer.block_rv)
            else:
                schedule_injective_block(sch, producer.block_rv, lanes)
        self._schedule_main(sch, main, infos[main_index + 1:], lanes, padded)
        return sch

    def _schedule_main(self, sch, main, epilogues, lanes: int, padded: bool = False) -> None:
        block = main.block_rv
        kinds = main.dom_kind()
        loops = sch.get_loops(block)
        spatial = [l for l, k in zip(loops, kinds) if k == "S"]
        reduce = [l for l, k in zip(loops, kinds) if k == "R"]
        col_ext = _extent(sch, spatial[-1])
        col_inner = _column_block(col_ext, lanes)
        col_outer, col_in = sch.split(spatial[-1], factors=[None, col_inner])
        vector = _vector_width(col_inner, lanes)
        col_vectors = None
        if vector < col_inner and col_inner % lanes:
            # 24 columns: three 8-lane vectors (one 24-lane vector was 6x slower, see
            # _column_block), unrolled like the rows
            col_vectors, col_in = sch.split(col_in, factors=[None, vector])
        vectors = max(1, col_inner // vector)
        row_out, row_in = None, None
        if len(spatial) >= 2:
            row_limit = max(1, min(_MAX_ROW_BLOCK, _MAX_ACCUMULATOR_VECTORS // vectors))
            row_inner = _largest_divisor(_extent(sch, spatial[-2]), row_limit)
            row_out, row_in = sch.split(spatial[-2], factors=[None, row_inner])
        outer = spatial[:-2] + ([row_out] if row_out is not None else [])
        inner = ([row_in] if row_in is not None else []) + (
            [col_vectors] if col_vectors is not None else []) + [col_in]
        # col_outer first: neighbouring parallel iterations reuse the same weight columns.
        sch.reorder(col_outer, *outer, *reduce, *inner)
        tile = sch.fuse(col_outer, *outer)
        sch.parallel(tile)
        # Accumulate in a small tile buffer (registers after unroll/vectorize), then apply
        # the epilogue on the way out. Scope "global", not "local": TVM's LowerTVMBuiltin puts
        # only small *global* CPU allocations on the stack; a "local" one became a
        # TVMBackendAllocWorkspace/FreeWorkspace pair in every parallel tile.
        write_back = sch.cache_write(block, 0, "global")
        # After pad_einsum the first epilogue copies the padded result into the real output.
        # Inlining that copy into the write-back dropped its bounds (TVM wrote the padded tile
        # into the unpadded output: out of bounds). Instead the rest of the chain is inlined
        # into the copy, which is computed under the tile loop, where reverse_compute_at clips
        # it to the real extent.
        unpad = epilogues[0].block_rv if padded else None
        self._inline_epilogues(sch, unpad or write_back, epilogues[1:] if padded else epilogues,
                               lanes)
        sch.reverse_compute_at(write_back, tile, preserve_unit_loops=True)
        wb_loops = sch.get_loops(write_back)[1:]
        if wb_loops:
            last = wb_loops[-1]
            if col_vectors is not None:
                _, last = sch.split(last, factors=[None, vector])
            sch.vectorize(last)
        if unpad is not None:
            sch.reverse_compute_at(unpad, tile, preserve_unit_loops=True)
        # Vectorize before decomposing: afterwards the update block is no longer a complete
        # reduction block and `vectorize` refuses it.
        if row_in is not None and _extent(sch, row_in) > 1:
            sch.unroll(row_in)
        if col_vectors is not None:
            sch.unroll(col_vectors)
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
        block reading x twice): EfficientNet's conv+SiLU kernels otherwise ran the sigmoid and
        the multiply as two more passes over the whole output (8-40 GFLOP/s)."""
        remaining = list(epilogues)
        for block in reversed(epilogues[:-1]):
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
            try:
                sch.reverse_compute_inline(remaining[0].block_rv)
            except ScheduleError:  # not elementwise: stays at root
                break
            remaining.pop(0)
        for block in remaining:
            schedule_injective_block(sch, block.block_rv, lanes)


class Generic(ScheduleRule):
    """Fallback for every other kernel: parallel over outer spatial loops, vectorized inner loop.

    Pooling and spatial means are reductions whose innermost *output* axis (channels, in NHWC)
    is contiguous: their reduction loops are moved outside that axis so it can be vectorized."""

    def apply(self, func, target: Target, _tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root")
        lanes = vector_lanes(target)
        inline_injective_chains(sch, root)
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
                reduce = [l for l, k in zip(loops, kinds) if k == "R"]
                sch.reorder(*reduce, loops[last_spatial])
                outer, inner = sch.split(loops[last_spatial], factors=[None, lanes])
                sch.reorder(outer, *reduce, inner)
                sch.vectorize(inner)
                spatial = [l for l, k in zip(loops, kinds) if k == "S"][:-1] + [outer]
                fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
                sch.parallel(fused)
                sch.decompose_reduction(block, reduce[0])
                return
        schedule_injective_block(sch, block, lanes)


def inline_injective_chains(sch: s_tir.Schedule, root) -> None:
    """Inline every spatial-only intermediate whose one reader is a spatial-only block of the
    same size. EfficientNet's hardswish, left in NCHW between NHWC convolutions, was fused as seven
    blocks (two adds, transpose, clip, divide, transpose, multiply): seven passes over memory
    with two strided transposes (6 GFLOP/s). Inlined, the transposes cancel in the index
    arithmetic and one vectorized pass remains. Producers smaller than a reader (broadcasts:
    squeeze-excite's per-channel sigmoid) are kept, as are producers of reductions: inlining
    would recompute them per output element. Producers with several readers are kept too:
    inlined, TVM's simplifier rewrote Softplus's Kahan form ``log(u) * t / (u - 1)``, u = 1 + t,
    into ``log(1 + t)``, losing the precision near zero it exists for."""
    outputs = {sch.get(b).name_hint for b in sch.get_output_blocks(root)}
    for block in sch.get_child_blocks(root):
        stmt = sch.get(block)
        if stmt.name_hint in outputs or not _spatial_only(stmt):
            continue
        consumers = sch.get_consumers(block)
        if len(consumers) == 1 and _spatial_only(sch.get(consumers[0])) and \
                _written_elements(sch.get(consumers[0])) == _written_elements(stmt):
            try:
                sch.compute_inline(block)
            except ScheduleError:  # e.g. not a plain computation; scheduled on its own
                continue


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


def _called_ops(expr) -> set[str]:
    """Names of the intrinsics an expression calls (a small walk: TVM 0.27 exposes no TIR
    expression visitor to Python)."""
    found, stack = set(), [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, tvm.ir.expr.Call):
            found.add(str(node.op.name) if hasattr(node.op, "name") else "")
            stack.extend(node.args)
        for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
            child = getattr(node, attr, None)
            if isinstance(child, tvm.ir.Expr):
                stack.append(child)
    return found


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
    each of the 1000 outputs: 3.0 ms instead of microseconds (light ResNet-50 here)."""

    def apply(self, func, target: Target, tunable: bool):
        if not isinstance(func, tirx.PrimFunc) or not _leading_spatial_axes_agree(func):
            return None
        if not _reduces_innermost(func):
            return None
        return super().apply(func, target, tunable)


def _reduces_innermost(func: tirx.PrimFunc) -> bool:
    """Whether every reduction reads its inputs along their innermost dim. A spatial mean in
    NHWC reduces H and W while C is innermost: dlight's Reduction then ran one scalar loop per
    channel, striding over memory (EfficientNet's global pools: 2 GFLOP/s); Generic vectorizes
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


RULES = (Contraction(), RowReduction(), Generic())
