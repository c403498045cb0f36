"""AMX-BF16 tile intrinsics for the packed bf16 matmul (compiler/dot_kernels.py's ``BF16``
format): one tensor intrinsic computes a whole register tile of the output over the whole
reduction, its sums kept in AMX tile registers from the first product to the last.

The BF16 format's packed weight ``[N/16, K/2, 16, 2]`` is already the layout ``tdpbf16ps``
reads as its B operand: 16 rows of K pairs, each row 16 columns x 2 bf16 (64 bytes), so a
weight tile is one ``tileloadd`` of K/2 consecutive pair-rows. The activation's rows are A
tiles straight from memory (``tileloadd`` takes the row stride), and the float32 sums are
stored to the kernel's tile buffer, where the epilogue reads them.

Registers: tmm0-3 hold up to 2 x 2 tiles of sums (tr rows x 16 columns each), tmm4-5 the A
tiles of a reduction step (tr rows x kt bf16), tmm6-7 the B tiles (kt/2 pair-rows x 16
columns). Each call loads its tile configuration (``ldtilecfg``): it belongs to the thread,
and the kernel's parallel tiles run on TVM's worker threads.

The immediate-operand forms of LLVM's AMX intrinsics (``llvm.x86.tileloadd64(i8 tmm, ...)``,
clang's ``_tile_loadd``) name the registers; the ``.internal`` forms would need LLVM's
``x86_amx`` type, which TIR cannot express.

Linux hands AMX state to a process only once it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``); until then the first tile instruction raises SIGILL. The exported
library asks when it is loaded (targets/x86.py, AMX_PERMISSION_SOURCE, linked in by
compiler/build.py), the Python runtime before it loads one (``x86.request_amx``), and so does
the compiler's process, which may run the kernels it schedules."""

from __future__ import annotations

import functools

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..tvmscript import top_level

# Rows of one A or C tile, and bf16 values of the reduction per A tile (64 bytes), at most
TILE_ROWS = 16
TILE_K = 32
LANES = 16  # float32 columns of a C tile (64 bytes), the BF16 format's block


def intrinsic_name(rows: int, a_tiles: int, b_tiles: int, k: int, kt: int) -> str:
    return f"aotc_amx_bf16_{a_tiles}x{rows}_{b_tiles}x16_k{k}_{kt}"


def _tile_config(rows: int, kt: int) -> list[int]:
    """The 64-byte ldtilecfg operand as 16 little-endian words: palette 1; tmm0-3 sums (rows x
    64 bytes), tmm4-5 A (rows x kt*2 bytes), tmm6-7 B (kt/2 rows x 64 bytes). Only words 0
    (palette), 4-7 (bytes per row) and 12-13 (rows) are not zero."""
    config = bytearray(64)
    config[0] = 1
    for tmm in range(8):
        tile_rows, bytes_per_row = ((rows, 64) if tmm < 4 else (rows, kt * 2) if tmm < 6
                                    else (kt // 2, 64))
        config[16 + 2 * tmm:18 + 2 * tmm] = bytes_per_row.to_bytes(2, "little")
        config[48 + tmm] = tile_rows
    words = [int.from_bytes(config[4 * w:4 * w + 4], "little") for w in range(16)]
    assert all(words[w] == 0 for w in range(16) if w not in (0, 4, 5, 6, 7, 12, 13))
    return words


@functools.cache
def register(rows: int, a_tiles: int, b_tiles: int, k: int, kt: int) -> str:
    """Register (once) and name the intrinsic of a tile of ``a_tiles`` x ``rows`` output rows
    and ``b_tiles`` blocks of 16 columns over a reduction of ``k`` bf16 values, ``kt`` per
    step: C[i, j] += A[i, r] * B[j / 16, r / 2, j % 16, r % 2] in bf16 x bf16 -> float32."""
    assert rows <= TILE_ROWS and kt <= TILE_K and kt % 2 == 0 and k % kt == 0
    assert a_tiles * b_tiles <= 4
    m = rows * a_tiles
    n_blocks = b_tiles
    pairs = k // 2
    words = _tile_config(rows, kt)

    @top_level.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (m, k), "uint16", offset_factor=1)
        B = T.match_buffer(b, (n_blocks, pairs, 16, 2), "uint16", offset_factor=1)
        C = T.match_buffer(c, (m, n_blocks * 16), "float32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:m, 0:n_blocks * 16], A[0:m, 0:k], B[0:n_blocks, 0:pairs, 0:16, 0:2])
            T.writes(C[0:m, 0:n_blocks * 16])
            for i, j, ko, kg in T.grid(m, n_blocks * 16, pairs, 2):
                with T.sblock("update"):
                    vi = T.axis.spatial(m, i)
                    vj = T.axis.spatial(n_blocks * 16, j)
                    vk = T.axis.reduce(k, ko * 2 + kg)
                    C[vi, vj] = C[vi, vj] + T.reinterpret(
                        "float32", T.shift_left(T.Cast("uint32", A[vi, vk]), T.uint32(16))
                    ) * T.reinterpret(
                        "float32", T.shift_left(T.Cast("uint32", B[vj // 16, vk // 2, vj % 16,
                                                                   vk % 2]), T.uint32(16)))

    @top_level.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sb0 = T.int32()
        sb1 = T.int32()
        sb2 = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (m, k), "uint16", strides=[sa, 1], offset_factor=1)
        B = T.match_buffer(b, (n_blocks, pairs, 16, 2), "uint16", strides=[sb0, sb1, sb2, 1],
                           offset_factor=1)
        C = T.match_buffer(c, (m, n_blocks * 16), "float32", strides=[sc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:m, 0:n_blocks * 16], A[0:m, 0:k], B[0:n_blocks, 0:pairs, 0:16, 0:2])
            T.writes(C[0:m, 0:n_blocks * 16])
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
            for ti in T.unroll(a_tiles):
                for tj in T.unroll(b_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(ti * b_tiles + tj),
                        T.address_of(C[ti * rows, tj * 16]), T.Cast("int64", sc * 4)))
            for step in range(k // kt):
                for ti in T.unroll(a_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(4 + ti),
                        T.address_of(A[ti * rows, step * kt]), T.Cast("int64", sa * 2)))
                for tj in T.unroll(b_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(6 + tj),
                        T.address_of(B[tj, step * (kt // 2), 0, 0]), T.int64(64)))
                for ti in T.unroll(a_tiles):
                    for tj in T.unroll(b_tiles):
                        T.evaluate(T.call_llvm_intrin(
                            "void", "llvm.x86.tdpbf16ps", T.uint8(ti * b_tiles + tj),
                            T.uint8(4 + ti), T.uint8(6 + tj)))
            for ti in T.unroll(a_tiles):
                for tj in T.unroll(b_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tilestored64", T.uint8(ti * b_tiles + tj),
                        T.address_of(C[ti * rows, tj * 16]), T.Cast("int64", sc * 4)))

    name = intrinsic_name(rows, a_tiles, b_tiles, k, kt)
    TensorIntrin.register(name, desc, impl, override=True)
    return name


def _without_init(func):
    """``func`` (te.create_prim_func of one reduction: loops and blocks) with its reduction
    block's init removed: a tensor intrinsic describes the update (the kernel's init is
    decomposed into a block of its own before tensorizing); its root block reads every
    parameter and writes the last, as an intrinsic's description must say."""
    import tvm
    from tvm import s_tir, tirx

    buffers = list(func.params)  # buffers, as TVM 0.27 gives a PrimFunc's parameters
    whole = [tirx.BufferRegion(b, [tvm.ir.Range.from_min_extent(0, d) for d in b.shape])
             for b in buffers]

    def rebuilt(stmt):
        if isinstance(stmt, tirx.For):
            return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, rebuilt(stmt.body))
        if isinstance(stmt, s_tir.SBlockRealize):
            return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, rebuilt(stmt.block))
        if isinstance(stmt, s_tir.SBlock) and stmt.name_hint == "root":
            return s_tir.SBlock(stmt.iter_vars, [whole[-1], *whole[:-1]], [whole[-1]], "root",
                                rebuilt(stmt.body), None, stmt.alloc_buffers,
                                stmt.match_buffers, stmt.annotations)
        if isinstance(stmt, s_tir.SBlock):  # the update reads its sums, as a decomposed one
            return s_tir.SBlock(stmt.iter_vars, [*stmt.writes, *stmt.reads], stmt.writes,
                                stmt.name_hint,
                                rebuilt(stmt.body), None, stmt.alloc_buffers,
                                stmt.match_buffers, stmt.annotations)
        return stmt
    return func.with_body(rebuilt(func.body))


@functools.cache
def register_conv(rows: int, a_tiles: int, b_tiles: int, kh: int, kw: int, stride: int,
                  dh: int, dw: int, channels: int, kt: int, merged: bool = False) -> str:
    """Register (once) and name the intrinsic of a conv tile (compiler/dot_kernels.conv2d_nhwc,
    BF16): ``a_tiles`` x ``rows`` neighbouring output pixels of one output row, ``b_tiles``
    blocks of 16 output channels, summed over the kh x kw taps and ``channels`` input
    channels, ``kt`` per step. An A tile is ``rows`` input pixels ``stride`` apart (one
    ``tileloadd`` with that row stride), a B tile the packed weight of one tap. Taps of a
    1-wide kernel axis have no loop (as the kernel, whose unit axes are dropped).

    ``merged`` (a few input channels: an image's 3, padded to 4): a row's kw taps and their
    channels, kw x ``channels`` values one after the other in an NHWC input of exactly
    ``channels`` channels, are summed as one reduction of ``kt`` values a step, and the kw
    taps' packed weights, also one after the other, as one B operand. The A buffer's pixel
    stride is fixed at ``channels``: a kernel whose input has another does not match."""
    from tvm import te

    from ..dot_kernels import BF16

    assert rows <= TILE_ROWS and kt <= TILE_K and kt % 2 == 0
    assert ((kw * channels) if merged else channels) % kt == 0 and a_tiles * b_tiles <= 4
    m, n = rows * a_tiles, b_tiles * LANES
    span_h, span_w = (kh - 1) * dh + 1, (m - 1) * stride + (kw - 1) * dw + 1
    a = te.placeholder((span_h, span_w, channels), "uint16", "A")
    b = te.placeholder((b_tiles, kh, kw, channels // 2, LANES, 2), "uint16", "B")
    rh = te.reduce_axis((0, kh), "rh") if kh > 1 else None
    rw = te.reduce_axis((0, kw), "rw") if kw > 1 else None
    rc = te.reduce_axis((0, channels), "rc")
    axes = [axis for axis in (rh, rw, rc) if axis is not None]

    def update(j, o):
        th = rh if rh is not None else 0
        tw = rw if rw is not None else 0
        return te.sum(BF16.product(a[th * dh, j * stride + tw * dw, rc],
                                   b[o // LANES, th, tw, rc // 2, o % LANES, rc % 2]), axis=axes)
    c = te.compute((m, n), update, name="update")
    desc = _without_init(te.create_prim_func([a, b, c]))
    words = _tile_config(rows, kt)
    if merged:
        assert dw == 1 and (kw * channels) % kt == 0
        return _register_merged(desc, words, rows, a_tiles, b_tiles, kh, kw, stride, dh,
                                channels, kt, span_h, span_w, m, n)
    steps = channels // kt

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
        A = T.match_buffer(pa, (span_h, span_w, channels), "uint16", strides=[sa0, sa1, 1],
                           offset_factor=1)
        B = T.match_buffer(pb, (b_tiles, kh, kw, channels // 2, LANES, 2), "uint16",
                           strides=[sb0, sb1, sb2, sb3, sb4, 1], offset_factor=1)
        C = T.match_buffer(pc, (m, n), "float32", strides=[sc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:m, 0:n], A[0:span_h, 0:span_w, 0:channels],
                    B[0:b_tiles, 0:kh, 0:kw, 0:channels // 2, 0:LANES, 0:2])
            T.writes(C[0:m, 0:n])
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
            for ti in T.unroll(a_tiles):
                for tj in T.unroll(b_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(ti * b_tiles + tj),
                        T.address_of(C[ti * rows, tj * LANES]), T.Cast("int64", sc * 4)))
            for th, tw, step in T.grid(kh, kw, steps):
                for ti in T.unroll(a_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(4 + ti),
                        T.address_of(A[th * dh, ti * rows * stride + tw * dw, step * kt]),
                        T.Cast("int64", sa1 * stride * 2)))
                for tj in T.unroll(b_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(6 + tj),
                        T.address_of(B[tj, th, tw, step * (kt // 2), 0, 0]), T.int64(64)))
                for ti in T.unroll(a_tiles):
                    for tj in T.unroll(b_tiles):
                        T.evaluate(T.call_llvm_intrin(
                            "void", "llvm.x86.tdpbf16ps", T.uint8(ti * b_tiles + tj),
                            T.uint8(4 + ti), T.uint8(6 + tj)))
            for ti in T.unroll(a_tiles):
                for tj in T.unroll(b_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tilestored64", T.uint8(ti * b_tiles + tj),
                        T.address_of(C[ti * rows, tj * LANES]), T.Cast("int64", sc * 4)))

    name = (f"aotc_amx_bf16_conv_{a_tiles}x{rows}_{b_tiles}x16_{kh}x{kw}_s{stride}"
            f"_d{dh}x{dw}_c{channels}_{kt}")
    TensorIntrin.register(name, desc, impl, override=True)
    return name


def _register_merged(desc, words, rows, a_tiles, b_tiles, kh, kw, stride, dh, channels, kt,
                     span_h, span_w, m, n) -> str:
    """register_conv's ``merged`` form: per row of taps, kw x channels values a step."""
    steps = kw * channels // kt

    @top_level.prim_func(s_tir=True)
    def impl(pa: T.handle, pb: T.handle, pc: T.handle) -> None:
        sa0 = T.int32()
        sb0 = T.int32()
        sb1 = T.int32()
        sc = T.int32()
        A = T.match_buffer(pa, (span_h, span_w, channels), "uint16",
                           strides=[sa0, channels, 1], offset_factor=1)
        B = T.match_buffer(pb, (b_tiles, kh, kw, channels // 2, LANES, 2), "uint16",
                           strides=[sb0, sb1, channels * LANES, 2 * LANES, 2, 1],
                           offset_factor=1)
        C = T.match_buffer(pc, (m, n), "float32", strides=[sc, 1], offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:m, 0:n], A[0:span_h, 0:span_w, 0:channels],
                    B[0:b_tiles, 0:kh, 0:kw, 0:channels // 2, 0:LANES, 0:2])
            T.writes(C[0:m, 0:n])
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
            for ti in T.unroll(a_tiles):
                for tj in T.unroll(b_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(ti * b_tiles + tj),
                        T.address_of(C[ti * rows, tj * LANES]), T.Cast("int64", sc * 4)))
            for th, step in T.grid(kh, steps):
                for ti in T.unroll(a_tiles):
                    # step * kt values past the row's first tap (its pixel's channels run
                    # on into the next taps' pixels: the address, not the channel, matters)
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(4 + ti),
                        T.address_of(A[th * dh, ti * rows * stride, step * kt]),
                        T.int64(stride * channels * 2)))
                for tj in T.unroll(b_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tileloadd64", T.uint8(6 + tj),
                        T.address_of(B[tj, th, 0, step * (kt // 2), 0, 0]),
                        T.int64(64)))
                for ti in T.unroll(a_tiles):
                    for tj in T.unroll(b_tiles):
                        T.evaluate(T.call_llvm_intrin(
                            "void", "llvm.x86.tdpbf16ps", T.uint8(ti * b_tiles + tj),
                            T.uint8(4 + ti), T.uint8(6 + tj)))
            for ti in T.unroll(a_tiles):
                for tj in T.unroll(b_tiles):
                    T.evaluate(T.call_llvm_intrin(
                        "void", "llvm.x86.tilestored64", T.uint8(ti * b_tiles + tj),
                        T.address_of(C[ti * rows, tj * LANES]), T.Cast("int64", sc * 4)))

    name = (f"aotc_amx_bf16_conv_merged_{a_tiles}x{rows}_{b_tiles}x16_{kh}x{kw}_s{stride}"
            f"_d{dh}_c{channels}_{kt}")
    TensorIntrin.register(name, desc, impl, override=True)
    return name
