"""AMX tile intrinsics for the packed bf16 and int8 contractions (compiler/dot_kernels.py's
``BF16`` and ``INT8`` formats): one tensor intrinsic computes a whole tile of the output over
the whole reduction, its sums kept in AMX tile registers from the first product to the last.

The formats' packed weights, ``[N/16, K/G, 16, G]`` (a conv's ``[OC/16, KH, KW, IC/G, 16,
G]``), are already the layout the tile products read as their B operand: rows of G values of
16 columns, 64 bytes, so a weight tile is one ``tileloadd`` of consecutive rows. bf16:
``tdpbf16ps``, G = 2, float32 sums; int8: ``tdpbusd`` (u8 activations x s8 weights), G = 4,
int32 sums. The activation's rows are A tiles straight from memory (``tileloadd`` takes the
row stride: a matmul's rows, a conv's neighbouring output pixels one stride apart), and the sums
are stored to the kernel's tile buffer, where the epilogue reads them.

Registers: tmm0-3 hold up to 2 x 2 tiles of sums (rows x 16 columns each), tmm4-5 the A tiles
of a reduction step (rows x up to 64 bytes), tmm6-7 the B tiles. Each call loads its tile
configuration (``ldtilecfg``): it belongs to the thread, and the kernel's parallel tiles run on
TVM's worker threads. The load is marked (``TILE_CONFIG``), and the schedule phase moves it out
of the loops that load only that configuration (passes/lowering/hoisted_tile_configs.py).

The descriptions are built from te, as dot_kernels builds the kernels (the same product), the
reduction's init included: each call starts its sums from zero (``tilezero``). The
implementations use the immediate-operand forms of LLVM's AMX intrinsics
(``llvm.x86.tileloadd64(i8 tmm, ...)``, clang's ``_tile_loadd``), which name the registers; the
``.internal`` forms would need LLVM's ``x86_amx`` type, which TIR cannot express.

Linux hands AMX state to a process only once it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``); until then the first tile instruction raises SIGILL. The exported
library asks when it is loaded (targets/x86.py, AMX_PERMISSION_SOURCE, linked in by
compiler/build.py), the Python runtime before it loads one (``x86.request_amx``), and so does
the compiler's process, which may run the kernels it schedules."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import tvm
from tvm import s_tir, te, tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..dot_kernels import BF16, INT8, DotFormat
from ..tvmscript import top_level

TILE_ROWS = 16  # rows of one A or C tile, at most
TILE_BYTES = 64  # bytes of one tile row
LANES = 16  # 32-bit sums in a C tile row: the formats' block of output channels
# The implementations' block annotation: sums from zero, every one of the tile stored, so the
# init that tensorize keeps is dead (passes/lowering/overwritten_inits.py drops it).
SUMS_FROM_ZERO = "aotc.sums_from_zero"
# The attribute statement around the implementations' tile configuration (its buffer and the
# ldtilecfg), its value the configuration's words: a kernel whose configurations are all the
# same loads it once per parallel task (passes/lowering/hoisted_tile_configs.py).
TILE_CONFIG = "aotc.amx_tile_config"


@dataclass(frozen=True)
class _Kind:
    fmt: DotFormat
    instruction: str
    value_bytes: int  # of the activation

    @property
    def max_step(self) -> int:
        """Activation values one A tile row holds."""
        return TILE_BYTES // self.value_bytes


KINDS = {"bf16": _Kind(BF16, "llvm.x86.tdpbf16ps", 2), "int8": _Kind(INT8, "llvm.x86.tdpbusd", 1)}


def step(kind: str, length: int) -> int:
    """Values of a reduction of ``length`` each A tile takes for format ``kind``: the largest
    multiple of the format's group that divides it and fits a tile row (0: none)."""
    k = KINDS[kind]
    group = k.fmt.group
    return max((d for d in range(group, k.max_step + 1, group) if length % d == 0), default=0)


def b_tiles(columns: int) -> int:
    """B tiles (of 16 columns) beside each other in a tile of sums: two where they divide
    ``columns``, else one."""
    return 2 if columns % (2 * LANES) == 0 else 1


def _tile_config(rows: int, step_bytes: int, b_rows: int) -> list[int]:
    """The 64-byte ldtilecfg operand as 16 little-endian words: palette 1; tmm0-3 sums (rows x
    64 bytes), tmm4-5 A (rows x ``step_bytes``), tmm6-7 B (``b_rows`` x 64 bytes). Only words 0
    (palette), 4-7 (bytes per row) and 12-13 (rows) are not zero."""
    config = bytearray(64)
    config[0] = 1
    for tmm in range(8):
        tile_rows, bytes_per_row = ((rows, TILE_BYTES) if tmm < 4 else (rows, step_bytes)
                                    if tmm < 6 else (b_rows, TILE_BYTES))
        config[16 + 2 * tmm:18 + 2 * tmm] = bytes_per_row.to_bytes(2, "little")
        config[48 + tmm] = tile_rows
    words = [int.from_bytes(config[4 * w:4 * w + 4], "little") for w in range(16)]
    assert all(words[w] == 0 for w in range(16) if w not in (0, 4, 5, 6, 7, 12, 13))
    return words


def _description(func):
    """``func`` (te.create_prim_func of one reduction: loops and blocks) as a tensor
    intrinsic's description: the reduction block, init included, reading its own sums too (as
    the kernel's block does once the schedule caches its writes), inside a root block that
    reads the operands and writes the sums. With the init in the description, the kernel's
    reduction is tensorized whole: the implementation starts its tiles of sums from zero
    (``tilezero``). Tensorize keeps the init on the block it makes; SUMS_FROM_ZERO has it
    dropped after the schedule, so that no block of zeros is written first."""
    buffers = list(func.params)  # buffers, as TVM 0.27 gives a PrimFunc's parameters
    whole = [tirx.BufferRegion(b, [tvm.ir.Range.from_min_extent(0, d) for d in b.shape])
             for b in buffers]

    def rebuilt(stmt):
        if isinstance(stmt, tirx.For):
            return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, rebuilt(stmt.body))
        if isinstance(stmt, s_tir.SBlockRealize):
            return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, rebuilt(stmt.block))
        if isinstance(stmt, s_tir.SBlock) and stmt.name_hint == "root":
            return s_tir.SBlock(stmt.iter_vars, whole[:-1], [whole[-1]], "root",
                                rebuilt(stmt.body), None, stmt.alloc_buffers,
                                stmt.match_buffers, stmt.annotations)
        if isinstance(stmt, s_tir.SBlock):
            return s_tir.SBlock(stmt.iter_vars, [*stmt.writes, *stmt.reads], stmt.writes,
                                stmt.name_hint, rebuilt(stmt.body), stmt.init,
                                stmt.alloc_buffers, stmt.match_buffers, stmt.annotations)
        return stmt
    return func.with_body(rebuilt(func.body))


def _tile_macros(rows: int, a_tiles: int, b_tiles: int, words: list[int], instruction: str):
    """TVMScript macros every implementation shares: load the tile configuration ``words``
    (_tile_config), multiply the A tiles by the B tiles into the sums, store the sums of
    column group ``g`` to C (row stride ``sc`` floats or int32s). The configuration is marked
    ``TILE_CONFIG`` with its words as the value (passes/lowering/hoisted_tile_configs.py)."""
    config_key = ",".join(str(w) for w in words)

    @T.macro
    def configure():
        with T.attr(0, TILE_CONFIG, config_key):
            cfg = T.alloc_buffer((16,), "uint32", scope="local")
            for word in T.unroll(16):
                cfg[word] = T.uint32(0)
            cfg[0] = T.uint32(words[0])
            cfg[4] = T.uint32(words[4])
            cfg[5] = T.uint32(words[5])
            cfg[6] = T.uint32(words[6])
            cfg[7] = T.uint32(words[7])
            cfg[12] = T.uint32(words[12])
            cfg[13] = T.uint32(words[13])
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(cfg[0])))

    @T.macro
    def multiply():
        for ti in T.unroll(a_tiles):
            for tj in T.unroll(b_tiles):
                T.evaluate(T.call_llvm_intrin("void", instruction, T.uint8(ti * b_tiles + tj),
                                              T.uint8(4 + ti), T.uint8(6 + tj)))

    @T.macro
    def store(C, sc, g):
        for ti in T.unroll(a_tiles):
            for tj in T.unroll(b_tiles):
                T.evaluate(T.call_llvm_intrin(
                    "void", "llvm.x86.tilestored64", T.uint8(ti * b_tiles + tj),
                    T.address_of(C[ti * rows, (g * b_tiles + tj) * LANES]),
                    T.Cast("int64", sc * 4)))

    return configure, multiply, store


@functools.cache
def register(kind: str, rows: int, a_tiles: int, b_tiles: int, k: int, kt: int,
             groups: int = 1, k_block: int = 0) -> str:
    """Register (once) and name the matmul intrinsic of format ``kind`` ("bf16", "int8"): a
    tile of ``a_tiles`` x ``rows`` output rows and ``groups`` x ``b_tiles`` blocks of 16
    columns over a reduction of ``k`` values, ``kt`` a step: C[i, j] += A[i, r] * B[j / 16,
    r / G, j % 16, r % G]. The ``groups`` column tiles take turns on each ``k_block`` values
    of K (all of K with 0), so that the rows' block of A stays in L1; their sums go to C
    between turns. One call loads the tile configuration once for all of it: ``ldtilecfg`` is
    costly, and once per tile it was a large share of a short-K matmul
    (docs/design/measurements.md)."""
    spec = KINDS[kind]
    fmt, group = spec.fmt, spec.fmt.group
    k_block = k_block or k
    assert rows <= TILE_ROWS and kt <= spec.max_step and kt % group == 0 and k_block % kt == 0
    assert a_tiles * b_tiles <= 4 and k % k_block == 0
    m, n = rows * a_tiles, groups * b_tiles * LANES
    n_blocks = groups * b_tiles
    a = te.placeholder((m, k), fmt.operand, "A")
    b = te.placeholder((n_blocks, k // group, LANES, group), fmt.weight, "B")
    r = te.reduce_axis((0, k), "r")
    c = te.compute((m, n), lambda i, j: te.sum(fmt.product(
        a[i, r], b[j // LANES, r // group, j % LANES, r % group]), axis=[r]), name="update")
    desc = _description(te.create_prim_func([a, b, c]))
    configure, multiply, store = _tile_macros(
        rows, a_tiles, b_tiles, _tile_config(rows, kt * spec.value_bytes, kt // group),
        spec.instruction)
    operand, weight, acc = fmt.operand, fmt.weight, fmt.acc
    a_bytes = spec.value_bytes

    @top_level.prim_func(s_tir=True)
    def impl(pa: T.handle, pb: T.handle, pc: T.handle) -> None:
        sa = T.int32()
        sb0 = T.int32()
        sb1 = T.int32()
        sb2 = T.int32()
        sc = T.int32()
        A = T.match_buffer(pa, (m, k), operand, strides=[sa, 1], offset_factor=1)
        B = T.match_buffer(pb, (n_blocks, k // group, LANES, group), weight,
                           strides=[sb0, sb1, sb2, 1], offset_factor=1)
        C = T.match_buffer(pc, (m, n), acc, strides=[sc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(A[0:m, 0:k], B[0:n_blocks, 0:k // group, 0:LANES, 0:group])
            T.writes(C[0:m, 0:n])
            T.sblock_attr({SUMS_FROM_ZERO: True})
            configure()
            for kb, g in T.grid(k // k_block, groups):
                for ti in T.unroll(a_tiles):
                    for tj in T.unroll(b_tiles):
                        if kb == 0:
                            T.evaluate(T.call_llvm_intrin(
                                "void", "llvm.x86.tilezero", T.uint8(ti * b_tiles + tj)))
                        else:  # the sums of the earlier K blocks, stored below
                            T.evaluate(T.call_llvm_intrin(
                                "void", "llvm.x86.tileloadd64", T.uint8(ti * b_tiles + tj),
                                T.address_of(C[ti * rows, (g * b_tiles + tj) * LANES]),
                                T.Cast("int64", sc * 4)))
                for s in range(k_block // kt):
                    for ti in T.unroll(a_tiles):
                        T.evaluate(T.call_llvm_intrin(
                            "void", "llvm.x86.tileloadd64", T.uint8(4 + ti),
                            T.address_of(A[ti * rows, kb * k_block + s * kt]),
                            T.Cast("int64", sa * a_bytes)))
                    for tj in T.unroll(b_tiles):
                        T.evaluate(T.call_llvm_intrin(
                            "void", "llvm.x86.tileloadd64", T.uint8(6 + tj),
                            T.address_of(B[g * b_tiles + tj, (kb * k_block + s * kt) // group,
                                           0, 0]), T.int64(TILE_BYTES)))
                    multiply()
                store(C, sc, g)

    name = f"aotc_amx_{kind}_{a_tiles}x{rows}_{groups}x{b_tiles}x16_k{k}_{k_block}_{kt}"
    TensorIntrin.register(name, desc, impl, override=True)
    return name


@functools.cache
def register_conv(kind: str, rows: int, a_tiles: int, b_tiles: int, kh: int, kw: int,
                  stride: int, dh: int, dw: int, channels: int, kt: int,
                  merged: bool = False, groups: int = 1, row_step: int = 0) -> str:
    """Register (once) and name the conv intrinsic of format ``kind`` (dot_kernels.conv2d_nhwc,
    one group): ``a_tiles`` x ``rows`` neighbouring output pixels of one output row,
    ``b_tiles`` blocks of 16 output channels, summed over the kh x kw taps and ``channels``
    input channels, ``kt`` a step. An A tile is ``rows`` input pixels ``stride`` apart (one
    ``tileloadd`` with that row stride), a B tile the packed weight of one tap. Taps of a
    1-wide kernel axis have no loop (as the kernel, whose unit axes are dropped). ``groups``
    tiles of columns follow one another in one call (one ``ldtilecfg`` for all).

    ``merged`` (a few input channels: an image's 3, padded to the group): a row's kw taps and
    their channels, kw x ``channels`` values one after the other in an NHWC input of exactly
    ``channels`` channels, are summed as one reduction of ``kt`` values a step, and the kw
    taps' packed weights, also one after the other, as one B operand: valid where the input's
    pixels are exactly ``channels`` apart and the weight is packed whole (the schedule checks
    the first; PrepackWeights' constants are the second).

    ``row_step`` (dot_kernels.conv2d_flat: the flattened padded image, one row of positions,
    ``dh`` 0): tap row ``th`` reads ``th * row_step`` positions further on, so that an A tile
    is ``rows`` consecutive positions whatever image row they fall in."""
    spec = KINDS[kind]
    fmt, group = spec.fmt, spec.fmt.group
    assert rows <= TILE_ROWS and kt <= spec.max_step and kt % group == 0
    assert ((kw * channels) if merged else channels) % kt == 0 and a_tiles * b_tiles <= 4
    assert not merged or dw == 1
    m, n = rows * a_tiles, groups * b_tiles * LANES
    n_blocks = groups * b_tiles
    span_h = (kh - 1) * dh + 1
    span_w = (m - 1) * stride + (kh - 1) * row_step + (kw - 1) * dw + 1
    a = te.placeholder((span_h, span_w, channels), fmt.operand, "A")
    b = te.placeholder((n_blocks, kh, kw, channels // group, LANES, group), fmt.weight, "B")
    rh = te.reduce_axis((0, kh), "rh") if kh > 1 else None
    rw = te.reduce_axis((0, kw), "rw") if kw > 1 else None
    rc = te.reduce_axis((0, channels), "rc")
    axes = [axis for axis in (rh, rw, rc) if axis is not None]

    def update(j, o):
        th = rh if rh is not None else 0
        tw = rw if rw is not None else 0
        return te.sum(fmt.product(a[th * dh, j * stride + th * row_step + tw * dw, rc],
                                  b[o // LANES, th, tw, rc // group, o % LANES, rc % group]),
                      axis=axes)
    c = te.compute((m, n), update, name="update")
    desc = _description(te.create_prim_func([a, b, c]))
    configure, multiply, store = _tile_macros(
        rows, a_tiles, b_tiles, _tile_config(rows, kt * spec.value_bytes, kt // group),
        spec.instruction)
    operand, weight, acc = fmt.operand, fmt.weight, fmt.acc
    a_bytes = spec.value_bytes
    steps = (kw * channels if merged else channels) // kt
    taps_w = 1 if merged else kw  # tap loops inside a row: none where merged

    @top_level.prim_func(s_tir=True)
    def impl(pa: T.handle, pb: T.handle, pc: T.handle) -> None:
        sa0 = T.int32()
        sa1 = T.int32()
        sb0 = T.int32()
        sb1 = T.int32()
        sb2 = T.int32()
        sb3 = T.int32()
        sb4 = T.int32()
        sc = T.int32()
        A = T.match_buffer(pa, (span_h, span_w, channels), operand,
                           strides=[sa0, sa1, 1], offset_factor=1)
        B = T.match_buffer(pb, (n_blocks, kh, kw, channels // group, LANES, group), weight,
                           strides=[sb0, sb1, sb2, sb3, sb4, 1], offset_factor=1)
        C = T.match_buffer(pc, (m, n), acc, strides=[sc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(A[0:span_h, 0:span_w, 0:channels],
                    B[0:n_blocks, 0:kh, 0:kw, 0:channels // group, 0:LANES, 0:group])
            T.writes(C[0:m, 0:n])
            T.sblock_attr({SUMS_FROM_ZERO: True})
            configure()
            for g in range(groups):
                for t in T.unroll(a_tiles * b_tiles):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.uint8(t)))
                for th, tw, s in T.grid(kh, taps_w, steps):
                    for ti in T.unroll(a_tiles):
                        # merged: s * kt values past the row's first tap (its pixel's channels
                        # run on into the next taps' pixels: the address, not the channel,
                        # counts)
                        T.evaluate(T.call_llvm_intrin(
                            "void", "llvm.x86.tileloadd64", T.uint8(4 + ti),
                            T.address_of(A[th * dh, ti * rows * stride + th * row_step +
                                           tw * dw, s * kt]),
                            T.Cast("int64", sa1 * stride * a_bytes)))
                    for tj in T.unroll(b_tiles):
                        T.evaluate(T.call_llvm_intrin(
                            "void", "llvm.x86.tileloadd64", T.uint8(6 + tj),
                            T.address_of(B[g * b_tiles + tj, th, tw, s * (kt // group), 0, 0]),
                            T.int64(TILE_BYTES)))
                    multiply()
                store(C, sc, g)

    name = (f"aotc_amx_{kind}_conv{'_merged' if merged else ''}_{a_tiles}x{rows}_"
            f"{groups}x{b_tiles}x16"
            f"_{kh}x{kw}_s{stride}_d{dh}x{dw}{f'_r{row_step}' if row_step else ''}"
            f"_c{channels}_{kt}")
    TensorIntrin.register(name, desc, impl, override=True)
    return name

