"""ConvertBF16: ``--precision bf16``, float32 convolutions and matmuls with constant weights run
as bfloat16 dot products with float32 accumulation.

Runs in the quantize phase, after RealizeInt8 (layers int8 took are no longer float32
contractions; a model can mix both: --skip-layers left out of int8 then go bf16), before
lowering. Each site (contraction_sites.py: NHWC conv2d of one group, matmul with a 2-D constant
weight)
becomes
    xb  = to_bf16_bits(x)                                 uint16, round to nearest even
    y   = bf16 kernel(xb, prepacked bf16 W)               float32 sums (compiler/dot_kernels.py)
and what followed (bias, activation, residual add) stays float32 in the kernel's epilogue.
FuseOps puts ``to_bf16_bits`` into the producer's epilogue, so that the activation travels
as 2 bytes a value (where a residual add reads that activation too, ResidualFromBF16 has it
read the bf16 copy). The weights are rounded to bfloat16 and packed at compile time.

3x3 stride-1 convs that WinogradConv would take (when it runs) take their Winograd form
instead: F(4x4) ones are left to WinogradConv (float32), F(2x2) ones become the same three
kernels with a bf16 product (winograd_kernels.py).

Which sites: every one (``bytes_per_row`` can keep small weights float32). With the
matmul tiles of cpu_dot.MATMUL_TILE_ROWS a bf16 matmul ran at about twice its float32 twin
on an AVX512-BF16 CPU of AMD's (docs/design/measurements.md#compilerquantizebf16py); on AMX
targets the kernels run on tile registers instead (default_schedules/amx_intrinsics.py),
several times the AVX512-BF16 kernel's rate (measurements.md, amx_intrinsics.py), matmul
rows no AMX tile divides are padded for one (amx_padded_rows) and so are conv widths
(amx_padded_width); padded stride-1 convs whose output rows take one tile each run over their
flattened padded image, tiles running on across image rows (amx_flat_rows). Elsewhere rows
that no 4-8-row tile
divides (ViT's 197 tokens) are padded to one block of a multiple of 8 (200), and symbolic ones
to blocks of 8, as PrepackWeights pads float32 ones.

What stays float32, and why: depthwise/grouped convolutions (no dot product over channels to
pack), matmuls of two activations outside the grouped attention (AttentionBF16 converts that
one, packing its operands at run time), normalization, softmax and every elementwise op.
Accuracy: bfloat16 keeps 8 significant bits (relative error at most 2^-8 per operand); the sums
are float32, so errors do not grow with the reduction length as bf16 sums would."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .. import dot_kernels
from ..contraction_sites import Site
from ..default_schedules import amx_intrinsics
from ..default_schedules.cpu_blocks import _largest_divisor
from ..default_schedules.cpu_dot import AMX_MIN_ROWS, amx_min_step
from ..frontends.relax_shapes import static_shape
from ..passes.layout.prepack_weights import (
    conv_padded_width,
    convert_sites,
    pads_rows,
    row_blocks_packed,
    site_kind,
    site_packed_call,
    tile_rows,
)
from ..passes.layout.winograd_conv import (
    emit_winograd,
    site_tile_size,
    unfusable_inputs,
    winograd_site,
)
from ..symbolic_padding import round_up

BYTES_PER_ROW = 0.0
# 3x3 convs with a Winograd form, where WinogradConv runs: F(4x4) ones are left float32 to
# WinogradConv (2.25 products an output, at float32's rate: in bf16 the transforms' constants,
# up to 8, grow the rounding errors of the bf16 operands far past the direct sum's), F(2x2)
# ones become bf16 Winograd kernels (4 products an output at bf16's rate; constants 0, +-1
# and 1/2 keep the errors near the direct sum's). Errors and timings:
# docs/design/measurements.md#compilerquantizebf16py.
WINOGRAD_FP32_TILE, WINOGRAD_BF16_TILE = 4, 2


def _weight_bytes_per_row(site: Site) -> float:
    weight = 4 * int(np.prod([int(d) for d in site.call.args[1].value.shape]))
    return weight / int(np.prod(static_shape(site.var)[:-1]))


def _winograd_tiles(site: Site) -> int | None:
    """m of the Winograd F(m x m, 3 x 3) form WinogradConv would give ``site`` (None: none;
    bf16 needs an even channel count, for its pairs of products)."""
    if not winograd_site(site, dot_kernels.BF16.lanes):
        return None
    m = site_tile_size(site)
    channels = int(site.call.args[1].value.shape[2])
    return m if m == WINOGRAD_FP32_TILE or channels % dot_kernels.BF16.group == 0 else None


# AMX (cpu_dot._amx_tile): the kernel runs 2 x 16-row tiles where the rows allow; fewer rows
# than AMX_MIN_ROWS stay on the vector kernel unpadded (a classifier's single row would pad
# 32-fold).
AMX_TILE_ROWS = 16


def amx_padded_rows(site: Site) -> int | None:
    """On AMX, the rows a static matmul is padded to (one block of them): a multiple of two
    tiles' rows (ViT's 197 tokens: 224), of one for 32 rows or fewer, where that takes fewer
    tiles than the deepest tile of AMX_MIN_ROWS to 16 rows that divides the rows (49 rows,
    wav2vec2's frames of a second of audio or ConvNeXt's last 7x7 tokens: 64 in 4 tiles, not 7
    tiles of 7; a tile of a few rows costs most of a full one); None where it does not, where
    the rows are fewer than AMX_MIN_ROWS or symbolic (blocks of dot_kernels.SYMBOLIC_ROWS), or
    for a conv."""
    rows = tile_rows(site)
    if site_kind(site) != "matmul" or rows is None or rows < AMX_MIN_ROWS:
        return None
    step = 2 * AMX_TILE_ROWS if rows > 2 * AMX_TILE_ROWS else AMX_TILE_ROWS
    padded = round_up(rows, step)
    depth = _largest_divisor(rows, AMX_TILE_ROWS)
    if depth >= AMX_MIN_ROWS and padded // AMX_TILE_ROWS >= rows // depth:
        return None
    return padded


def amx_padded_width(site: Site) -> int | None:
    """On AMX, the output columns a conv computes where no tile of AMX_MIN_ROWS to 16 rows
    divides its output width (wav2vec2's strided convs over 799 and 199 steps): the width
    rounded up to whole tiles of 16 (800, 208); the kernel reads zeros past the input's edge
    and crops the extra columns (dot_kernels.conv2d_nhwc). Left at 799, such a conv ran on the
    vector kernel, several times slower (docs/design/measurements.md). None for a matmul, a
    width a tile divides or one under AMX_MIN_ROWS."""
    width = tile_rows(site)
    if site_kind(site) != "conv2d" or width is None or width < AMX_MIN_ROWS or \
            _largest_divisor(width, AMX_TILE_ROWS) >= AMX_MIN_ROWS:
        return None
    return round_up(width, AMX_TILE_ROWS)


def _per_row_tiles(width: int, height: int) -> tuple[int, int]:
    """(AMX tiles, A tiles a step) of a conv's per-row kernel (cpu_dot._amx_tile): tiles of
    the deepest divisor of the output width up to 16 rows (of 16 over a width
    amx_padded_width pads), two side by side where they fit."""
    depth = _largest_divisor(width, AMX_TILE_ROWS)
    if depth < AMX_MIN_ROWS:
        width, depth = round_up(width, AMX_TILE_ROWS), AMX_TILE_ROWS
    return height * (width // depth), 2 if width % (2 * depth) == 0 else 1


def amx_flat_rows(site: Site) -> int | None:
    """On AMX, the positions a padded stride-1 conv computes over its flattened padded image
    (dot_kernels.conv2d_flat), where that runs it in fewer tiles than one output row at a
    time, or as many but two A tiles a step where a row takes one: ResNet's 7x7 stage (a
    3x3 conv's 61 positions padded to 64: 4 tiles of 16, not 7 of 7) and 14x14 one (224
    positions, 7 pairs of tiles, where a row of 14 pixels is one tile). Each B tile loaded
    then feeds 32 rows instead of 7 or 14. The positions: the real ones rounded up to pairs
    of 16. None where the per-row kernel is as good (wide outputs: two tiles a row), for
    strided, grouped or symbolic convs, and for unpadded ones (1x1): their per-row kernel
    reads the activation itself, the flat one a padded copy of it."""
    if site_kind(site) != "conv2d" or int(site.call.attrs.groups) != 1:
        return None
    attrs = site.call.attrs
    in_shape, out_shape = static_shape(site.call.args[0]), static_shape(site.var)
    padding = [int(p) for p in attrs.padding]
    if in_shape is None or out_shape is None or not any(padding) or \
            any(int(s) != 1 for s in attrs.strides) or attrs.data_layout != "NHWC":
        return None
    kh, kw, channels = (int(d) for d in site.call.args[1].value.shape[:3])
    fmt = dot_kernels.BF16
    if amx_intrinsics.step(fmt.name, round_up(channels, fmt.group)) < amx_min_step(fmt.name):
        return None  # a few channels (an image's): the per-row kernel merges their taps
    dilation = [int(d) for d in attrs.dilation]
    wp, _, oh, ow = dot_kernels.flat_conv_positions(in_shape[1], in_shape[2], kh, kw,
                                                    padding, dilation)
    if (oh, ow) != tuple(out_shape[1:3]):
        return None
    row_tiles, row_a_tiles = _per_row_tiles(ow, oh)
    positions = round_up((oh - 1) * wp + ow, 2 * AMX_TILE_ROWS)
    if row_a_tiles == 2 or positions // AMX_TILE_ROWS > row_tiles:
        return None
    return positions


def _emit_flat_conv(bb: relax.BlockBuilder, site: Site, xb: relax.Expr, positions: int
                    ) -> relax.Expr:
    """The bf16 conv of ``site`` over its flattened padded image (amx_flat_rows)."""
    weight = site.weight()
    fmt = dot_kernels.BF16
    packed = dot_kernels.packed_tensor(
        dot_kernels.pack_conv_weight, weight, fmt,
        dot_kernels.conv_packed_shape(weight.shape, fmt, whole_tiles=True))
    attrs = site.call.attrs
    return bb.emit_te(dot_kernels.conv2d_flat, xb, relax.const(packed), weight.shape[3],
                      [int(p) for p in attrs.padding], [int(d) for d in attrs.dilation], 0,
                      positions, primfunc_name_hint="conv2d_bf16")


def _emit_bf16(bb: relax.BlockBuilder, site: Site, x: relax.Expr, amx: bool) -> relax.Expr:
    xb = bb.emit_te(dot_kernels.to_bf16_bits, x, primfunc_name_hint="to_bf16")
    positions = amx_flat_rows(site) if amx else None
    if positions is not None:
        return _emit_flat_conv(bb, site, xb, positions)
    padded = amx_padded_rows(site) if amx else None
    if padded is not None:
        return row_blocks_packed(bb, site, xb, dot_kernels.BF16, "matmul_bf16", padded)
    if tile_rows(site) is None or pads_rows(site, dot_kernels.BF16.lanes):
        return row_blocks_packed(bb, site, xb, dot_kernels.BF16, "matmul_bf16")
    # a conv's width no tile divides: computed padded, as PrepackWeights does float32 ones
    width = amx_padded_width(site) if amx else conv_padded_width(site, dot_kernels.BF16.lanes)
    return bb.emit_te(*site_packed_call(site, xb, dot_kernels.BF16, padded_width=width),
                      primfunc_name_hint=f"{site_kind(site)}_bf16")


@tvm.transform.module_pass(opt_level=0, name="ConvertBF16")
class ConvertBF16:
    """``enabled`` False (precision fp32) leaves the module as it is; ``bytes_per_row``:
    sites with less float32 weight per output row stay float32 (0, the default: every site
    goes bf16); ``winograd`` (WinogradConv will run): 3x3 convs with a Winograd form take it,
    F(4x4) left to WinogradConv, F(2x2) as bf16 Winograd kernels; ``amx`` (the target has
    AMX-BF16): matmul rows no AMX tile divides are padded for one (amx_padded_rows)."""

    def __init__(self, enabled: bool, bytes_per_row: float = BYTES_PER_ROW,
                 winograd: bool = False, amx: bool = False):
        # On AMX a direct conv's tiles outrun a Winograd form's vector products
        self.enabled, self.bytes_per_row = enabled, bytes_per_row
        self.winograd, self.amx = winograd and not amx, amx

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not self.enabled:
            return mod
        def keep(site: Site) -> bool:
            if self.winograd and _winograd_tiles(site) == WINOGRAD_FP32_TILE:
                return False  # for WinogradConv
            return self.bytes_per_row <= 0 or _weight_bytes_per_row(site) >= self.bytes_per_row

        def emit(bb: relax.BlockBuilder, site: Site, x: relax.Expr) -> relax.Expr:
            if self.winograd and _winograd_tiles(site) == WINOGRAD_BF16_TILE:
                return emit_winograd(bb, site, x, dot_kernels.BF16.lanes, dot_kernels.BF16)
            return _emit_bf16(bb, site, x, self.amx)
        return unfusable_inputs(convert_sites(mod, keep, emit, symbolic_rows=True))
