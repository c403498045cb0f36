"""PrepackWeights: float32 conv2d (NHWC; one group, or groups of whole blocks) and matmul
with constant weights become packed kernels (compiler/dot_kernels.py, ``fp32_format``) whose
weights are laid out at compile time as ``[OC/L, KH, KW, IC, L]`` / ``[N/L, K, L]``, L = the
target's float32 lanes.

Why: with HWIO / [K, N] weights, each reduction step of a register tile reads L floats of a
different row, ``OC`` floats apart: for weights past the L2 cache that is one page per step,
and such kernels run at half the rate of cache-resident ones. Packed, a tile streams its
weight block in order (docs/design/measurements.md#compilerpasseslayoutprepack_weightspy). Results
are bit-identical: the same products
summed in the same order.

Where it sits: after the quantize phase (int8 and bf16 take their sites first: what is left as
float32 conv/matmul is packed here), before lowering, whose FoldConstant would otherwise see
the weights as plain constants. Sites it leaves to ``Contraction``: output channels that fill
whole blocks only with more than a third more (MAX_CHANNEL_PADDING: 20 channels, 32 computed;
up to a third more, as MobileNets' 24 and 40 channels or a 50,257-word vocabulary head, are
padded and cropped in the kernel), depthwise convolutions, grouped ones whose groups are not
whole blocks of output channels, and matmuls of two activations (a grouped conv of whole blocks
packs as an ungrouped one of its group's inputs, each block reading its group). A matmul whose
row count has no divisor between 4 and 8 (ViT's 197 tokens) runs as one block of padded rows,
read from the activation itself with rows past the last clamped to it (their results are
cropped; a padded copy of the activation would be a kernel of its own before each such matmul);
a symbolic row count has its rows padded to blocks (below); a conv whose output width has none
(wav2vec2's strided convs over 799 and 199 steps) computes a padded width (padded_width: 800,
200), reading zeros past the input's edge, and crops it in its kernel. Left to Contraction such
convs could not take its padded tile either (TVM's pad_einsum refuses a strided read) and fell
to the generic schedule, two orders of magnitude slower. CPU targets only (GPU rules do not
read the packed layout).

A matmul whose rows are symbolic (a model exported with dynamic axes: [batch, seq, K]) is
packed too: its rows are padded to blocks of dot_kernels.SYMBOLIC_ROWS (an axis of blocks, a
static one of rows), the packed kernel runs on them, and the padded rows are sliced off. Left
to Contraction, such matmuls ran unpacked at about half the speed of a fixed-length build.

A matmul's weight is packed with the count of column blocks (up to 1/16 more than its columns
need) whose register tile does the most work per real column, for the target's register file
(dot_kernels.packed_blocks, cpu_dot.packed_matmul_tile_merit): on AVX-512 a count of blocks
that 3 does not divide (64 for 1,024 columns, 3,142 for GPT-2's 50,257) took tiles of 16
accumulators where three blocks of eight rows hold 24. A single row keeps its count: each
weight vector feeds one multiply-add whatever the tile."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from ... import dot_kernels, symbolic_padding
from ...contraction_sites import Site, find_sites
from ...default_schedules.cpu_blocks import _largest_divisor
from ...default_schedules.cpu_contraction import INLINE_PRODUCERS_MAX_REDUCTION
from ...default_schedules.cpu_dot import packed_matmul_tile_merit
from ...relax_walk import has_main, mutate_functions

_MAX_ROWS = 8
# Output channels are padded to whole blocks (and the result cropped) when that adds at most
# this share: a 50,257-word vocabulary head (GPT-2) or 1,000 classes gain the packed tile for
# almost nothing, and MobileNets' 24, 40 and 72 channels compute up to a third more at more
# than twice Contraction's rate on such counts (docs/design/measurements.md); 20 channels
# (32 computed) stay with Contraction.
MAX_CHANNEL_PADDING = 1 / 3


def packed_call(call: relax.Call, weight: np.ndarray, x: relax.Expr,
                fmt: dot_kernels.DotFormat, pad_value: int = 0, input_layout: str = "NHWC",
                padded_width: int | None = None,
                tile_merit: Callable[[int], float] | None = None):
    """(te function, args...) for ``emit_te``: the conv2d/matmul ``call`` as a packed kernel of
    ``fmt`` reading ``x`` (already in the format's operand type; a conv2d's ``x`` in
    ``input_layout``), ``weight`` (HWIO / [K, N], in the format's input type) packed at
    compile time; a conv2d computing ``padded_width`` output columns (dot_kernels.conv2d_nhwc)
    if given; a matmul's column blocks counted by ``tile_merit`` if given
    (dot_kernels.packed_blocks)."""
    if call.op.name == "relax.matmul":
        packed = dot_kernels.packed_tensor(
            dot_kernels.pack_matmul_weight, weight, fmt,
            dot_kernels.matmul_packed_shape(weight.shape, fmt, whole_tiles=True,
                                            tile_merit=tile_merit))
        return (dot_kernels.matmul, x, relax.const(packed), weight.shape[1], pad_value)
    attrs = call.attrs
    groups = int(attrs.groups)
    # a grouped conv's blocks must map to its groups: no padding block
    packed = dot_kernels.packed_tensor(dot_kernels.pack_conv_weight, weight, fmt,
                                       dot_kernels.conv_packed_shape(weight.shape, fmt,
                                                                     whole_tiles=groups == 1))
    return (dot_kernels.conv2d_nhwc, x, relax.const(packed), weight.shape[3],
            [int(s) for s in attrs.strides], [int(p) for p in attrs.padding],
            [int(d) for d in attrs.dilation], pad_value, input_layout, padded_width, groups)


def site_packed_call(site: Site, x: relax.Expr, fmt: dot_kernels.DotFormat,
                     input_layout: str = "NHWC", padded_width: int | None = None,
                     tile_merit: Callable[[int], float] | None = None):
    """packed_call of a float32 site, its constant weight converted by ``fmt``'s packing."""
    return packed_call(site.call, site.weight(), x, fmt, input_layout=input_layout,
                       padded_width=padded_width, tile_merit=tile_merit)


# Input channels up to which a conv reads an NCHW input in place of its NHWC transpose (an
# image: gray, RGB, RGBA). Each reduction step then reads a different plane; a few planes are
# a few streams, many would be as many cache lines per output vector.
_NCHW_MAX_CHANNELS = 4
_TO_NHWC = [0, 2, 3, 1]


def reads_nchw_in_place(site: Site) -> bool:
    """Whether the conv2d ``site`` may read an NCHW input in place: few channels, and a
    reduction short enough that the schedule reads its input through guards rather than a
    padded copy (cpu_contraction.INLINE_PRODUCERS_MAX_REDUCTION). With a padded copy the
    transpose only moves into that copy, so such stems keep the transpose."""
    if site_kind(site) != "conv2d" or int(site.call.attrs.groups) > 1:
        return False
    kh, kw, channels = (int(d) for d in site.call.args[1].value.shape[:3])
    return channels <= _NCHW_MAX_CHANNELS and kh * kw * channels <= \
        INLINE_PRODUCERS_MAX_REDUCTION


def nchw_source(bb: relax.BlockBuilder, site: Site, x: relax.Expr) -> relax.Expr | None:
    """The NCHW tensor ``y`` when ``x`` is bound to ``permute_dims(y, [0, 2, 3, 1])`` and the
    conv2d ``site`` reads_nchw_in_place: ConvertLayoutNHWC's transpose of a model's image
    input, which the stem conv then reads in place (the class docstring)."""
    if not reads_nchw_in_place(site):
        return None
    value = bb.lookup_binding(x) if isinstance(x, relax.Var) else None
    if not isinstance(value, relax.Call) or value.op != tvm.ir.Op.get("relax.permute_dims"):
        return None
    axes = value.attrs.axes
    return value.args[0] if axes is not None and [int(a) for a in axes] == _TO_NHWC else None


def site_kind(site: Site) -> str:
    return "matmul" if site.call.op.name == "relax.matmul" else "conv2d"


def tile_rows(site: Site) -> int | None:
    """The output axis the packed tile's rows run along: the output width of a conv2d (NHWC),
    the rows M of a matmul; None when symbolic (a sequence length)."""
    rows = site.var.ty.shape[-2]
    return int(rows) if isinstance(rows, tvm.tirx.IntImm) else None


def packs_well(site: Site, lanes: int) -> bool:
    """Whether ``site`` fills whole blocks of ``lanes`` output channels (up to
    MAX_CHANNEL_PADDING of padding) and has rows a register tile divides (the rules in the
    module docstring; symbolic rows are padded to dot_kernels.SYMBOLIC_ROWS); ConvertFP16 asks
    too."""
    rows = tile_rows(site)
    return whole_channels(site, lanes) and (rows is None or whole_rows(rows))


def whole_channels(site: Site, lanes: int) -> bool:
    """Whether the output channels fill whole blocks of ``lanes`` with at most
    MAX_CHANNEL_PADDING of padding; a grouped conv's, every group exactly (a block must read
    one group's inputs)."""
    channels = int(site.var.ty.shape[-1])
    if site_kind(site) == "conv2d" and int(site.call.attrs.groups) > 1:
        return channels % (int(site.call.attrs.groups) * lanes) == 0
    return -(-channels // lanes) * lanes <= channels * (1 + MAX_CHANNEL_PADDING)


def whole_rows(rows: int, max_rows: int = _MAX_ROWS) -> bool:
    """Whether a register tile of 4 to ``max_rows`` rows divides ``rows`` (or the rows fit one
    tile)."""
    return rows <= max_rows or any(rows % r == 0 for r in range(4, max_rows + 1))


def padded_width(rows: int) -> int:
    """The fewest rows at or above ``rows`` that a register tile of 4 to 8 rows divides (ties:
    the deeper tile's): 199 -> 200, 11 -> 12."""
    return min((-(-rows // r) * r, -r) for r in range(4, _MAX_ROWS + 1))[0]


def pads_width(site: Site, lanes: int) -> bool:
    """A conv2d with whole channel blocks whose output width no tile divides (wav2vec2's
    strided convs over 799 and 199 steps): PrepackWeights packs it computing padded_width
    columns, the extra ones cropped in the kernel."""
    rows = tile_rows(site)
    return (site_kind(site) == "conv2d" and rows is not None and not whole_rows(rows)
            and whole_channels(site, lanes))


def conv_padded_width(site: Site, lanes: int) -> int | None:
    """The output columns a conv computes where pads_width holds (padded_width), else None."""
    return padded_width(tile_rows(site)) if pads_width(site, lanes) else None


def pads_rows(site: Site, lanes: int, max_rows: int = _MAX_ROWS) -> bool:
    """A matmul with whole channel blocks whose static row count no tile of 4 to ``max_rows``
    rows divides (ViT's 197 tokens): PrepackWeights pads its rows to blocks of
    dot_kernels.SYMBOLIC_ROWS, as it does a symbolic row count."""
    rows = tile_rows(site)
    return (site_kind(site) == "matmul" and rows is not None and not whole_rows(rows, max_rows)
            and whole_channels(site, lanes))


# Where the broadcast activation needs a register of its own (AVX2), the deepest tile of two
# blocks has 6 rows (R*2 + 2 weights + the broadcast + a spare <= 16 registers:
# cpu_dot._tile_with_broadcast_register). A matmul whose rows only 7 divides (49 frames of a
# second of wav2vec2 audio) took a 7x1 tile, each broadcast feeding one multiply-add; its
# rows padded to a multiple of 8 run 4x2 (docs/design/measurements.md).
_BROADCAST_REGISTER_ROWS = 6


@relax.expr_functor.mutator
class SiteRewriter(relax.PyExprMutator):
    """Replaces each site's binding with ``emit(builder, site, activation)``'s result (the
    activation already rewritten); every other binding is visited as usual."""

    def __init__(self, mod, sites: dict, emit: Callable):
        super().__init__(mod)
        self.sites, self.emit = sites, emit   # sites: binding var -> Site

    def visit_var_binding_(self, binding):
        site = self.sites.get(binding.var)
        if site is None:
            super().visit_var_binding_(binding)
            return
        y = self.emit(self.builder_, site, self.visit_expr(site.activation))
        if not isinstance(binding.var, relax.DataflowVar):
            y = self.builder_.emit_output(y, binding.var.name)
        self.set_var_remap(binding.var, y)


def rewrite_sites(mod: tvm.IRModule, sites: dict, emit: Callable) -> tvm.IRModule:
    return relax.transform.DeadCodeElimination()(
        mutate_functions(mod, SiteRewriter(mod, sites, emit)))


def convert_sites(mod: tvm.IRModule, keep: Callable[[Site], bool],
                  emit: Callable, symbolic_rows: bool = False,
                  grouped: bool = False) -> tvm.IRModule:
    """``mod`` with main's sites that ``keep`` accepts replaced by ``emit``'s kernels (the
    packing passes: PrepackWeights, ConvertBF16, ConvertFP16)."""
    if not has_main(mod):
        return mod
    sites = {s.var: s for s in find_sites(mod["main"], symbolic_rows, grouped) if keep(s)}
    return rewrite_sites(mod, sites, emit) if sites else mod


@tvm.transform.module_pass(opt_level=0, name="PrepackWeights")
class PrepackWeights:
    """``lanes``: float32 lanes of the target's SIMD register (4, 8 or 16); None (a GPU
    target) leaves the module as it is. ``broadcast_register``: the target's multiply-adds
    take no broadcast memory operand (targets.broadcast_register: AVX2), so matmul rows only
    7 divides are padded (_BROADCAST_REGISTER_ROWS). ``registers``: the target's vector
    registers, which bound the register tile a matmul's count of column blocks is chosen for
    (dot_kernels.packed_blocks).

    A short conv of an image in NCHW (the model's input; ConvertLayoutNHWC put a transpose
    before it) reads the image in place, through the kernel's padding block: the transpose was
    a kernel of its own, one more pass over the image."""

    def __init__(self, lanes: int | None, broadcast_register: bool = False,
                 registers: int = 32):
        self.lanes, self.broadcast_register, self.registers = lanes, broadcast_register, \
            registers
        # rows a matmul's tile may take without padding them (_BROADCAST_REGISTER_ROWS)
        self.matmul_rows = _BROADCAST_REGISTER_ROWS if broadcast_register else _MAX_ROWS

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if self.lanes not in dot_kernels.FP32_FORMATS:
            return mod
        fmt = dot_kernels.fp32_format(self.lanes)

        def emit(bb, site, x):
            if flattens_rows(site, self.matmul_rows):
                return flat_rows_packed(bb, site, x, fmt,
                                        self.tile_merit(site, flattened_rows(site)))
            rows = tile_rows(site)
            if rows is None or pads_rows(site, self.lanes, self.matmul_rows):
                return row_blocks_packed(bb, site, x, fmt, tile_merit=self.tile_merit(
                    site, row_block(rows), symbolic_rows=rows is None), clamped=True)
            merit = self.tile_merit(site, rows) if site_kind(site) == "matmul" else None
            width = conv_padded_width(site, self.lanes)
            source = nchw_source(bb, site, x)
            call = site_packed_call(site, x, fmt, padded_width=width, tile_merit=merit) \
                if source is None else \
                site_packed_call(site, source, fmt, input_layout="NCHW", padded_width=width)
            return bb.emit_te(*call, primfunc_name_hint=f"{site_kind(site)}_packed")
        return convert_sites(mod, lambda s: packs_well(s, self.lanes)
                             or pads_rows(s, self.lanes, self.matmul_rows)
                             or pads_width(s, self.lanes), emit, symbolic_rows=True,
                             grouped=True)

    def tile_merit(self, site: Site, rows: int, symbolic_rows: bool = False
                   ) -> Callable[[int], float] | None:
        """cpu_dot.packed_matmul_tile_merit of a matmul site whose kernel's tile axis has
        ``rows`` rows; None for a single row (a matrix-vector product, bound by reading the
        weight once, whatever its tile)."""
        if rows < 2:
            return None
        reduction = int(site.call.args[0].ty.shape[-1])
        return packed_matmul_tile_merit(rows, reduction, self.registers,
                                        self.broadcast_register, symbolic_rows)


def row_block(rows: int | None) -> int:
    """The rows of row_blocks_packed's blocks: SYMBOLIC_ROWS for symbolic rows, else the rows
    rounded up to it (one block)."""
    return dot_kernels.SYMBOLIC_ROWS if rows is None else \
        symbolic_padding.round_up(rows, dot_kernels.SYMBOLIC_ROWS)


def flattened_rows(site: Site) -> int | None:
    """The rows of a matmul whose leading axes are static, all of them taken as rows (Swin's
    windows, [64, 49, C]: 3,136); None for a conv, symbolic axes or no axis before the rows."""
    dims = list(site.var.ty.shape.values)[:-1]
    if site_kind(site) != "matmul" or len(dims) < 2 or \
            not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return int(np.prod([int(d) for d in dims]))


def flattens_rows(site: Site, max_rows: int) -> bool:
    """A matmul whose rows no tile divides but whose rows and leading axes together a tile
    as deep as padding would give does (64 windows of 49 tokens: 3,136 = 4 x 784 on AVX2,
    where rows padded to a multiple of 8 run 4-row tiles too): its packed kernel runs on the
    flattened rows, with no padding, and restores the axes in its crop block. Where padded
    rows would run 8-row tiles (AVX-512), the flattened rows must divide by 8."""
    rows, flat = tile_rows(site), flattened_rows(site)
    if rows is None or flat is None or whole_rows(rows, max_rows):
        return False
    padded_tile = _largest_divisor(dot_kernels.SYMBOLIC_ROWS, max_rows)
    return _largest_divisor(flat, max_rows) >= max(4, padded_tile)


def flat_rows_packed(bb, site: Site, x: relax.Expr, fmt,
                     tile_merit: Callable[[int], float] | None = None) -> relax.Expr:
    """The packed matmul of flattens_rows: ``x`` reshaped to [rows, K], the kernel's result
    in the site's own shape."""
    shape = [int(d) for d in site.call.args[0].ty.shape.values]
    flat = bb.emit(relax.op.reshape(x, relax.ShapeExpr([flattened_rows(site), shape[-1]])))
    return bb.emit_te(*site_packed_call(site, flat, fmt, tile_merit=tile_merit), None,
                      shape[:-1],
                      primfunc_name_hint="matmul_packed")


def row_blocks_packed(bb, site: Site, x: relax.Expr, fmt, name: str = "matmul_packed",
                      block: int | None = None,
                      tile_merit: Callable[[int], float] | None = None,
                      clamped: bool = False) -> relax.Expr:
    """The packed matmul of a site whose rows are symbolic or have no tile-sized divisor:
    rows padded to whole blocks of ``block`` rows (an axis of blocks and a static one of
    rows: the tile's rows), the packed kernel, the blocks joined back and the padded rows
    sliced off. Symbolic rows take blocks of dot_kernels.SYMBOLIC_ROWS. Static rows are
    padded to one block, of ``block`` rows (bf16.py: padded for AMX tiles) or else of the
    rows rounded up to SYMBOLIC_ROWS (197 -> 200): the kernel's crop then reads row i of its
    one block as row i, an index the schedule can bound to a tile's rows and crop right after
    each tile (cpu_dot._crop_per_tile). With ``clamped`` (float32: PrepackWeights) static
    rows are not copied: the kernel reads its block from ``x`` itself, rows past the last
    reading the last (dot_kernels.matmul_clamped_rows). The AMX kernels' tile loads need the
    padded rows; the pad kernel is marked PAD_ROWS, so that the schedule phase has the
    activation's producer write them (passes/lowering/padded_rows_in_producer.py)."""
    shape = list(site.call.args[0].ty.shape.values)
    axis = len(shape) - 2
    rows = tile_rows(site)
    if block is None:
        block = row_block(rows)
    if rows is not None and clamped:
        _, xc, weight, columns, pad_value = site_packed_call(site, x, fmt, tile_merit=tile_merit)
        return bb.emit_te(dot_kernels.matmul_clamped_rows, xc, weight, columns, pad_value,
                          block, primfunc_name_hint=name)
    blocks = bb.emit_te(symbolic_padding.pad_axis_to_blocks, x, axis, block,
                        primfunc_name_hint="pad_rows",
                        primfunc_attrs={symbolic_padding.PAD_ROWS: axis})
    if rows is not None:  # static: cropped in the kernel, where the epilogue fuses
        return bb.emit_te(*site_packed_call(site, blocks, fmt, tile_merit=tile_merit), rows,
                          primfunc_name_hint=name)
    assert block == dot_kernels.SYMBOLIC_ROWS, "symbolic rows take blocks of SYMBOLIC_ROWS"
    y = bb.emit_te(*site_packed_call(site, blocks, fmt, tile_merit=tile_merit),
                   primfunc_name_hint=name)
    out_shape = list(site.var.ty.shape.values)
    padded = symbolic_padding.round_up(shape[axis], dot_kernels.SYMBOLIC_ROWS)
    joined = bb.emit(relax.op.reshape(y, relax.ShapeExpr(
        out_shape[:axis] + [padded] + out_shape[axis + 1:])))
    return bb.emit(relax.op.strided_slice(joined, axes=[axis], begin=[0], end=[shape[axis]],
                                          assume_inbound=True))
