"""The packed contractions: conv2d (NHWC) and matmul whose weights are prepacked at compile
time in the blocked order the kernel reads, in three formats:

- ``INT8`` (quantize/realize.py): u8 activations x s8 weights into int32, for x86's VNNI
  ``vpdpbusd`` (4 consecutive u8 x s8 products per int32 lane, 16 lanes);
- ``BF16`` (quantize/bf16.py, ``--precision bf16``): bfloat16 activations and weights into
  float32, for AVX512-BF16's ``vdpbf16ps`` (2 consecutive bf16 products per float32 lane).
  bfloat16 values travel as their uint16 bit patterns: TVM 0.27's LLVM codegen legalizes the
  bfloat16 type to float32, so a kernel written in it computes in float32.
- ``fp32_format(lanes)`` (passes/layout/prepack_weights.py): float32 with one product per
  lane, blocks of one SIMD register's lanes, for FMAs (the schedule vectorizes the lanes).
- ``FP16`` (quantize/fp16.py, ``--precision fp16``): float16 activations, weights and sums,
  32 lanes, for AVX512-FP16's ``vfmadd231ph`` (twice the multiply-adds of a float32 FMA);
  the kernel widens its sums to float32 on the way out, so the graph around it stays float32.

All pack the weights ``[OC/L, ..., IC/G, L, G]`` (L lanes, G products per lane): the LxG block
the instruction reads is contiguous, and the schedule (compiler/default_schedules/cpu_dot.py)
tensorizes
(or vectorizes) the two innermost loops onto it. Contiguous blocks are the point even for
float32: with HWIO weights each step of the reduction reads one 64-byte row of a different
page; packed, a tile streams its weights in order
(docs/design/measurements.md#compilerdot_kernelspy).
Channels that do not fill a block are padded: weights with zeros,
activations with ``pad_value`` (int8: the zero point, so that the zero-point correction,
computed over the real weights, stays exact; bf16: +0.0). Spatial padding is ``pad_value`` too.

The reduction block is named by the format (``DotFormat.block``): the schedule rule recognizes
the kernel, and its format, by it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

PAD_BLOCK = "aotc_dot_pad"
# The rows of a one-block padded activation read in the kernel (clamped_row_block)
CLAMPED_ROWS_BLOCK = "aotc_dot_clamped_rows"
CROP_BLOCK = "aotc_dot_crop"


@dataclass(frozen=True)
class DotFormat:
    name: str        # "int8" | "bf16" | "fp32"
    block: str       # name of the reduction block
    operand: str     # activation dtype the kernel reads
    weight: str      # packed weight dtype
    acc: str         # accumulator dtype
    group: int       # products summed into one lane per instruction
    lanes: int = 16  # output channels per block (one SIMD accumulator)

    def product(self, a, w):
        if self.name == "int8":
            return a.astype("int32") * w.astype("int32")
        if self.name in ("fp32", "fp16"):
            return a * w
        return bf16_value(a) * bf16_value(w)


INT8 = DotFormat("int8", "aotc_int8_contract", "uint8", "int8", "int32", 4)
BF16 = DotFormat("bf16", "aotc_bf16_contract", "uint16", "uint16", "float32", 2)
# float32 blocks as wide as the target's SIMD register: NEON 4, AVX2 8, AVX-512 16
FP32_FORMATS = {lanes: DotFormat("fp32", f"aotc_fp32x{lanes}_contract", "float32", "float32",
                                 "float32", 1, lanes) for lanes in (4, 8, 16)}
FP16 = DotFormat("fp16", "aotc_fp16x32_contract", "float16", "float16", "float16", 1, 32)
FORMATS = (INT8, BF16, FP16, *FP32_FORMATS.values())


# A symbolic row count (a sequence) is padded to whole blocks of this many rows for the packed
# kernel (PrepackWeights, compiler/symbolic_padding.py), and the result's rows sliced back.
SYMBOLIC_ROWS = 8

def fp32_format(lanes: int) -> DotFormat:
    return FP32_FORMATS[lanes]


def bf16_value(bits):
    """float32 value of bfloat16 bits (uint16): the bits are its upper half."""
    return tirx.reinterpret("float32", bits.astype("uint32") << tirx.const(16, "uint32"))


def bf16_rounded_bits(value):
    """The bfloat16 bits (uint16) of a float32 expression, rounded to nearest even (as
    vcvtneps2bf16 and numpy's ml_dtypes do); infinities stay, overflow rounds to infinity, and
    NaNs stay NaNs where their payload reaches the upper 7 bits of the mantissa (every NaN
    arithmetic makes: its quiet bit is one of them). A NaN whose payload lies only in the low
    16 bits (a signalling NaN written bit by bit) rounds to an infinity, where
    vcvtneps2bf16 would give a quiet NaN."""
    u = tirx.reinterpret("uint32", value)
    odd = (u >> tirx.const(16, "uint32")) & tirx.const(1, "uint32")
    return ((u + tirx.const(0x7FFF, "uint32") + odd) >> tirx.const(16, "uint32")).astype(
        "uint16")


def to_bf16_bits(x: te.Tensor) -> te.Tensor:
    """float32 -> bfloat16 bits (bf16_rounded_bits of every value)."""
    return te.compute(x.shape, lambda *i: bf16_rounded_bits(x(*i)), name="aotc_to_bf16")


def from_bf16_bits(bits: te.Tensor) -> te.Tensor:
    """bfloat16 bits (uint16) -> their float32 values (exact)."""
    return te.compute(bits.shape, lambda *i: bf16_value(bits(*i)), name="aotc_from_bf16")


def add_bf16_bits(x: te.Tensor, bits: te.Tensor) -> te.Tensor:
    """float32 ``x`` plus the float32 values of bfloat16 ``bits`` of the same shape."""
    return te.compute(x.shape, lambda *i: x(*i) + bf16_value(bits(*i)), name="aotc_add_bf16")


# Values bf16_bits converts at a time: its temporaries stay in L2; a whole layer at once
# (VGG-16's first classifier layer, 102 M values) was several times slower
# (docs/design/measurements.md)
_BF16_CHUNK = 1 << 18


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """numpy twin of to_bf16_bits, for weights at compile time: the same sum, (u + 0x7FFF +
    odd) >> 16, taken as the upper half plus the carry out of the lower one so that it stays
    in uint32, a chunk at a time."""
    values = np.ascontiguousarray(values, np.float32)
    flat = values.reshape(-1).view(np.uint32)
    out = np.empty(flat.shape, np.uint16)
    for start in range(0, flat.size, _BF16_CHUNK):
        u = flat[start:start + _BF16_CHUNK]
        high = u >> 16
        low = u & np.uint32(0xFFFF)
        low += np.uint32(0x7FFF)
        low += high & np.uint32(1)
        low >>= 16
        high += low
        out[start:start + _BF16_CHUNK] = high
    return out.reshape(values.shape)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def pack_conv_weight(weight_hwio: np.ndarray, fmt: DotFormat = INT8,
                     out: np.ndarray | None = None) -> np.ndarray:
    """HWIO (int8, or float32 for BF16 and float32) -> [OC/L, KH, KW, IC/G, L, G],
    zero-padded; written into ``out`` (of conv_packed_shape, whole_tiles or not) when given."""
    weight_hwio = bf16_bits(weight_hwio) if fmt is BF16 else weight_hwio
    kh, kw, ic, oc = weight_hwio.shape
    icp = _round_up(ic, fmt.group)
    if icp != ic:   # the channel groups of each kernel position padded apart
        padded = np.zeros((kh, kw, icp, oc), fmt.weight)
        padded[:, :, :ic] = weight_hwio
        weight_hwio = padded
    shape = conv_packed_shape(weight_hwio.shape, fmt)
    if out is not None:  # its block count: whole_tiles or not
        shape = (out.shape[0], *shape[1:])
    rows = weight_hwio.reshape(kh * kw * icp, oc)   # (kh, kw, ic) flattened: a [K, N] matrix
    panels = out.reshape(shape[0], -1, fmt.lanes, fmt.group) if out is not None else None
    return _pack_panels(rows, fmt, panels).reshape(shape)


def pack_matmul_weight(weight_kn: np.ndarray, fmt: DotFormat = INT8,
                       out: np.ndarray | None = None) -> np.ndarray:
    """[K, N] (int8, or float32 for BF16 and float32) -> [N/L, K/G, L, G], zero-padded;
    written into ``out`` (of matmul_packed_shape, whole_tiles or not) when given."""
    weight_kn = bf16_bits(weight_kn) if fmt is BF16 else weight_kn
    return _pack_panels(weight_kn, fmt, out)


# A packed weight of at least this many blocks whose count has no divisor from 2 to 4 gets one
# block more (packed_blocks): at most 1/16 more columns.
ODD_BLOCKS_PADDED_FROM = 16


def packed_blocks(columns: int, lanes: int, whole_tiles: bool = False,
                  tile_merit: Callable[[int], float] | None = None) -> int:
    """Blocks of ``lanes`` the packed weight of ``columns`` output columns holds: whole blocks,
    and with ``whole_tiles`` (PrepackWeights: its kernels crop their padded columns) where
    there are at least ODD_BLOCKS_PADDED_FROM, up to 1/16 more. The register tile takes whole
    blocks that divide the count, so a count like GPT-2's vocabulary head on AVX2 (50,257
    columns: 6,283 = 61 x 103 blocks of 8) left it one block a step, each broadcast feeding a
    single multiply-add; on AVX-512 (3,142 = 2 x 1,571 blocks of 16) two blocks, where three
    fill the register file. With ``tile_merit`` (the merit of the tile the kernel would take
    for a count of blocks: cpu_dot.packed_matmul_tile_merit) the count of the most merit per
    real column, the fewest blocks on a tie; without it, one block more where the count has no
    divisor from 2 to 4. The kernel computes the zero columns and crops them with the rest of
    the padding."""
    blocks = _round_up(columns, lanes) // lanes
    if not whole_tiles or blocks < ODD_BLOCKS_PADDED_FROM:
        return blocks
    if tile_merit is not None:
        counts = range(blocks, blocks + blocks // ODD_BLOCKS_PADDED_FROM + 1)
        return max(counts, key=lambda count: (tile_merit(count) * blocks / count, -count))
    if all(blocks % v for v in (2, 3, 4)):
        blocks += 1
    return blocks


def conv_packed_shape(hwio: tuple, fmt: DotFormat, whole_tiles: bool = False
                      ) -> tuple[int, ...]:
    kh, kw, ic, oc = hwio
    return (packed_blocks(oc, fmt.lanes, whole_tiles), kh, kw,
            _round_up(ic, fmt.group) // fmt.group, fmt.lanes, fmt.group)


def matmul_packed_shape(kn: tuple, fmt: DotFormat, whole_tiles: bool = False,
                        tile_merit: Callable[[int], float] | None = None) -> tuple[int, ...]:
    k, n = kn
    return (packed_blocks(n, fmt.lanes, whole_tiles, tile_merit),
            _round_up(k, fmt.group) // fmt.group,
            fmt.lanes, fmt.group)


def _pack_panels(weight_kn: np.ndarray, fmt: DotFormat, out: np.ndarray | None) -> np.ndarray:
    """out[j, a, l, g] = weight[a*G + g, j*L + l], zero where K or N are padded.

    One panel of L columns at a time: each copy reads whole cache lines of the weight's rows.
    A single transpose of the whole array (what this replaced) gathered across it and ran at a
    fraction of the memory bandwidth on large layers (docs/design/measurements.md, "Weight
    packing")."""
    k, n = weight_kn.shape
    group, lanes = fmt.group, fmt.lanes
    shape = out.shape if out is not None else matmul_packed_shape((k, n), fmt)
    if out is None:
        out = np.empty(shape, fmt.weight)
    whole = k // group * group
    for j in range(shape[0]):
        c0, c1 = j * lanes, min(n, (j + 1) * lanes)
        dest = out[j]                                   # [K/G, L, G]
        if c0 >= n:                                     # a whole block of padding
            dest[:] = 0
            continue
        panel = weight_kn[:, c0:c1]
        dest[:k // group, :c1 - c0] = panel[:whole].reshape(k // group, group, c1 - c0) \
            .transpose(0, 2, 1)
        if whole < k:                                  # the last group of K, zero-padded
            dest[k // group, :c1 - c0, :k - whole] = panel[whole:].T
            dest[k // group, :c1 - c0, k - whole:] = 0
        if c1 - c0 < lanes:
            dest[:, c1 - c0:] = 0
    return out


def packed_tensor(pack, weight: np.ndarray, fmt: DotFormat, shape: tuple[int, ...]):
    """``pack(weight, fmt, out=...)`` written straight into a new TVM tensor of ``shape``: the
    constant a kernel reads, with no copy of the packed weights on the way."""
    import tvm
    tensor = tvm.runtime.empty(shape, fmt.weight)
    pack(weight, fmt, out=np.from_dlpack(tensor))
    return tensor


def _format_of(w: te.Tensor) -> DotFormat:
    """The format of packed weights ``w``: by dtype, and for float32 by block width."""
    if str(w.dtype) == "float32":
        return FP32_FORMATS[int(w.shape[-2])]
    return {f.weight: f for f in (INT8, BF16, FP16)}[str(w.dtype)]


def _widened(acc: te.Tensor, fmt: DotFormat) -> te.Tensor:
    """float16 sums widened to float32 (the kernel's first epilogue); other formats' sums as
    they are (int8's are requantized by their caller)."""
    if fmt is not FP16:
        return acc
    return te.compute(acc.shape, lambda *i: acc(*i).astype("float32"), name="aotc_dot_widen")


def _crop(acc: te.Tensor, channels: int, width: int | None = None) -> te.Tensor:
    """``acc`` cut to ``channels`` (and, for a conv's NHWC result, to ``width`` columns)."""
    if int(acc.shape[-1]) == channels and (width is None or int(acc.shape[-2]) == width):
        return acc
    shape = list(acc.shape[:-1]) + [channels]
    if width is not None:
        shape[-2] = width
    return te.compute(shape, lambda *i: acc(*i), name=CROP_BLOCK)


def conv2d_nhwc(x: te.Tensor, w: te.Tensor, out_channels: int, strides, padding, dilation,
                pad_value: int, input_layout: str = "NHWC",
                padded_width: int | None = None, groups: int = 1) -> te.Tensor:
    """Accumulator-typed conv2d of ``x`` (the format's operand type) and packed ``w`` (its
    dtype names the format) into NHWC; ``padding`` is (top, left, bottom, right).
    ``input_layout`` "NCHW": ``x`` is read in place of its NHWC transpose, through the pad
    block (passes/layout/prepack_weights.py, nchw_source: a model's image input).
    ``padded_width``: the kernel computes that many output columns (more than the conv has:
    a width no register tile divides, such as 199), reading zeros past the input's right
    edge, and its crop block keeps the real ones. ``groups``: a grouped conv whose weight
    (HWIO: [KH, KW, IC/groups, OC]) packs as an ungrouped one of IC/groups inputs; each output
    block reads the input channels of its group (every group whole blocks of output channels,
    float32 only)."""
    fmt = _format_of(w)
    nchw = input_layout == "NCHW"
    n, h, width, c = (int(x.shape[i]) for i in ((0, 2, 3, 1) if nchw else (0, 1, 2, 3)))
    ocb, kh, kw, icb = (int(d) for d in w.shape[:4])
    icp = icb * fmt.group
    per_group = ocb * fmt.lanes // groups   # output channels of a group
    assert groups == 1 or (fmt.group == 1 and groups * icp == c and out_channels == ocb * fmt.lanes
                           and per_group % fmt.lanes == 0), "a grouped conv needs whole blocks"
    top, left, bottom, right = padding
    (sh, sw), (dh, dw) = strides, dilation
    ow = (width + left + right - (kw - 1) * dw - 1) // sw + 1
    wide = max(ow, padded_width or ow)
    # input columns the padded output reads past the right padding (zeros)
    extra = max(0, (wide - 1) * sw + (kw - 1) * dw + 1 - (width + left + right))
    # a padded channel of an NCHW input would read a plane past the tensor
    assert not nchw or icp == c, "an NCHW input needs a format of one product per lane"
    if any(padding) or groups * icp != c or nchw or extra:
        def padded(b, i, j, k):
            inside = tirx.all(i >= top, i < h + top, j >= left, j < width + left, k < c)
            value = x[b, k, i - top, j - left] if nchw else x[b, i - top, j - left, k]
            return tirx.if_then_else(inside, value, tirx.const(pad_value, fmt.operand))
        x = te.compute((n, h + top + bottom, width + left + right + extra, groups * icp),
                       padded, name=PAD_BLOCK)
    oh = (int(x.shape[1]) - (kh - 1) * dh - 1) // sh + 1
    rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")
    rc = te.reduce_axis((0, icp), "rc")
    lanes, group = fmt.lanes, fmt.group
    acc = te.compute((n, oh, wide, ocb * lanes), lambda b, i, j, o: te.sum(fmt.product(
        x[b, i * sh + rh * dh, j * sw + rw * dw, rc if groups == 1 else o // per_group * icp + rc],
        w[o // lanes, rh, rw, rc // group, o % lanes, rc % group]),
        axis=[rh, rw, rc]), name=fmt.block)
    return _widened(_crop(acc, out_channels, ow), fmt)


def flat_conv_positions(height: int, width: int, kh: int, kw: int, padding, dilation
                        ) -> tuple[int, int, int, int]:
    """(padded width Wp, padded height Hp, output height, output width) of a stride-1 conv
    over the flattened padded image (conv2d_flat)."""
    top, left, bottom, right = padding
    dh, dw = dilation
    hp, wp = height + top + bottom, width + left + right
    return wp, hp, hp - (kh - 1) * dh, wp - (kw - 1) * dw


def conv2d_flat(x: te.Tensor, w: te.Tensor, out_channels: int, padding, dilation,
                pad_value: int, grid_rows: int) -> te.Tensor:
    """Accumulator-typed stride-1 conv2d (one group, NHWC) of ``x`` (the format's operand
    type) and packed ``w``, computed over the flattened padded image: its pad block writes
    the padded image with its pixels flattened, [N, positions, C], and output position
    ``q`` = i * Wp + j (Wp the padded width) sums the positions ``q + rh * dh * Wp + rw *
    dw`` of every tap, so that the tile rows of an AMX kernel (default_schedules/
    amx_intrinsics.py, register_conv's row_step) are ``grid_rows`` consecutive positions, one tile
    load each, running on across image rows. Positions j >= the output width compute sums
    nobody reads, and so do positions past the last real one, (output height - 1) * Wp +
    output width, up to ``grid_rows``; the crop block keeps the real ones. The pad block
    writes zeros past the padded image for the positions the last tiles read."""
    fmt = _format_of(w)
    n, height, width, c = (int(d) for d in x.shape)
    ocb, kh, kw, icb = (int(d) for d in w.shape[:4])
    icp = icb * fmt.group
    top, left, _, _ = padding
    dh, dw = dilation
    wp, hp, oh, ow = flat_conv_positions(height, width, kh, kw, padding, dilation)
    assert (oh - 1) * wp + ow <= grid_rows
    length = grid_rows + (kh - 1) * dh * wp + (kw - 1) * dw  # positions the kernel reads

    def padded(b, q, k):
        i, j = q // wp - top, q % wp - left
        inside = tirx.all(q < hp * wp, i >= 0, i < height, j >= 0, j < width, k < c)
        return tirx.if_then_else(inside, x[b, i, j, k], tirx.const(pad_value, fmt.operand))
    flat = te.compute((n, length, icp), padded, name=PAD_BLOCK)
    rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")
    rc = te.reduce_axis((0, icp), "rc")
    lanes, group = fmt.lanes, fmt.group
    acc = te.compute((n, grid_rows, ocb * lanes), lambda b, q, o: te.sum(fmt.product(
        flat[b, q + rh * dh * wp + rw * dw, rc],
        w[o // lanes, rh, rw, rc // group, o % lanes, rc % group]),
        axis=[rh, rw, rc]), name=fmt.block)
    out = te.compute((n, oh, ow, out_channels), lambda b, i, j, o: acc[b, i * wp + j, o],
                     name=CROP_BLOCK)
    return _widened(out, fmt)


def matmul(x: te.Tensor, w: te.Tensor, out_features: int, pad_value: int,
           rows: int | None = None, out_lead: list[int] | None = None) -> te.Tensor:
    """Accumulator-typed ``x @ W`` of ``x`` [..., M, K] (the format's operand type) and packed
    ``w`` [N/16, K/G, 16, G] (its dtype names the format). ``rows``: ``x`` holds its rows in
    padded blocks ([..., M/R, R, K]) and the result is [..., rows, N], the padding cropped in
    the kernel's crop block (where its epilogue then runs). ``out_lead``: ``x`` is [M, K],
    the rows of a [*out_lead, K] activation flattened, and the result is [*out_lead, N],
    restored in the crop block."""
    fmt = _format_of(w)
    k = int(x.shape[-1])
    kp = int(w.shape[1]) * fmt.group
    lead = list(x.shape[:-1])
    if kp != k:
        x = te.compute(lead + [kp], lambda *i: tirx.if_then_else(
            i[-1] < k, x(*i), tirx.const(pad_value, fmt.operand)), name=PAD_BLOCK)
    rk = te.reduce_axis((0, kp), "rk")
    lanes, group = fmt.lanes, fmt.group
    acc = te.compute(lead + [int(w.shape[0]) * lanes], lambda *i: te.sum(fmt.product(
        x(*i[:-1], rk), w[i[-1] // lanes, rk // group, i[-1] % lanes, rk % group]),
        axis=[rk]), name=fmt.block)
    if rows is not None:
        return _widened(_crop_blocked_rows(acc, rows, out_features), fmt)
    if out_lead is not None:
        return _widened(_crop_flat_rows(acc, [int(d) for d in out_lead], out_features), fmt)
    return _widened(_crop(acc, out_features), fmt)


def matmul_clamped_rows(x: te.Tensor, w: te.Tensor, out_features: int, pad_value: int,
                        block: int) -> te.Tensor:
    """``matmul`` of ``x`` [..., M, K] with its M rows read as one block of ``block`` rows,
    rows past M reading row M - 1 (clamped_row_block): the result [..., M, N], the extra rows
    cropped. Each output row depends on its own input row only, so the extra rows' values
    never reach the result; read in the kernel, they need no padded copy of ``x``."""
    return matmul(clamped_row_block(x, block), w, out_features, pad_value,
                  rows=int(x.shape[-2]))


def clamped_row_block(x: te.Tensor, block: int) -> te.Tensor:
    """[..., M, K] -> [..., 1, block, K] (block >= M): row i reads row min(i, M - 1)."""
    rows = int(x.shape[-2])
    shape = list(x.shape[:-2]) + [1, block, x.shape[-1]]
    return te.compute(shape, lambda *i: x(*i[:-3], tirx.min(i[-2], rows - 1), i[-1]),
                      name=CLAMPED_ROWS_BLOCK)


def _crop_flat_rows(acc: te.Tensor, lead: list[int], channels: int) -> te.Tensor:
    """[M, N] -> [*lead, channels] (M = the product of ``lead``): flattened rows given their
    axes back and padded channels cropped in one pass."""
    def value(*i):
        flat = i[0]
        for axis, size in zip(i[1:-1], lead[1:]):
            flat = flat * size + axis
        return acc[flat, i[-1]]
    return te.compute(lead + [channels], value, name=CROP_BLOCK)


def _crop_blocked_rows(acc: te.Tensor, rows: int, channels: int) -> te.Tensor:
    """[..., blocks, R, N] -> [..., rows, channels]: block-padded rows and padded channels
    cropped in one pass."""
    per_block = int(acc.shape[-2])
    shape = list(acc.shape[:-3]) + [rows, channels]
    if rows <= per_block:  # one block: row i is its row i (an index the schedule can bound)
        return te.compute(shape, lambda *i: acc(*i[:-2], 0, i[-2], i[-1]), name=CROP_BLOCK)
    return te.compute(shape, lambda *i: acc(*i[:-2], i[-2] // per_block, i[-2] % per_block,
                                            i[-1]), name=CROP_BLOCK)
