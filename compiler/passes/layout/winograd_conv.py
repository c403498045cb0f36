"""WinogradConv: float32 3x3 stride-1 convolutions (NHWC, one group, constant weights) become
Winograd F(m x m, 3 x 3) kernels (compiler/winograd_kernels.py): an input transform, a packed
batched matmul whose weights are transformed at compile time, and an output transform that
the conv's bias, activation and residual add fuse into.

Why: 2.25 multiply-adds per output value and input channel instead of 9 (m=4); timed alone,
every 3x3 layer of ResNet-18 and UNet-like models gains (measurements in
docs/design/measurements.md#compilerpasseslayoutwinograd_convpy). The price: results differ
from the direct sum by ~1e-5 relative (the transforms' constants round in float32).
``--disable-pass WinogradConv`` keeps the direct kernels.

Which sites: the packed float32 ones (``packs_well``) whose output channels are whole blocks
without padding, with at least ``_MIN_CHANNELS`` input channels (fewer: the matmul's reduction
is too short to pay for the transforms; not measured below 16) and at least ``_MIN_TILES``
output tiles. Each transformed weight, (m+2)^2/9 times the size of the direct one, is used once
per tile: with few tiles the matmul streams more weight bytes than it computes on. Timed alone
the weights stay in L2 and every layer gains; end to end they do not
(docs/design/measurements.md#compilerpasseslayoutwinograd_convpy).
Tile size: m=4 where that
leaves ``_MIN_TILES`` tiles, else m=2 where that does. Sits in the pack phase before
PrepackWeights (which packs the direct convs left), after the quantize phase (int8, bf16 and
fp16 take their sites first)."""

from __future__ import annotations

import tvm
from tvm import relax

from ... import dot_kernels
from ... import winograd_kernels as wk
from ...contraction_sites import Site
from .prepack_weights import convert_sites, packs_well

_MIN_CHANNELS = 16
_MIN_TILES = 49


def winograd_site(site: Site, lanes: int) -> bool:
    call = site.call
    # whole blocks of output channels, none padded: the weight transform packs them exactly
    if call.op.name != "relax.nn.conv2d" or not packs_well(site, lanes) or \
            int(site.var.ty.shape[-1]) % lanes:
        return False
    if site_tile_size(site) is None:
        return False
    kh, kw, channels, _ = (int(d) for d in call.args[1].value.shape)
    attrs = call.attrs
    return ((kh, kw) == (3, 3) and channels >= _MIN_CHANNELS
            and [int(s) for s in attrs.strides] == [1, 1]
            and [int(d) for d in attrs.dilation] == [1, 1])


def site_tile_size(site: Site) -> int | None:
    n, out_h, out_w, _ = (int(d) for d in site.var.ty.shape)
    return tile_size(n, out_h, out_w)


def tile_size(batch: int, out_h: int, out_w: int) -> int | None:
    """m of F(m x m, 3 x 3): 4 where that leaves ``_MIN_TILES`` tiles, else 2 where that
    does; None (a direct conv) where neither does."""
    for m in (4, 2):
        if batch * wk.tiles(out_h, m) * wk.tiles(out_w, m) >= _MIN_TILES:
            return m
    return None


@tvm.transform.module_pass(opt_level=0, name="WinogradConv")
class WinogradConv:
    """``lanes``: float32 lanes of the target's SIMD register; None (a GPU target) leaves the
    module as it is."""

    def __init__(self, lanes: int | None):
        self.lanes = lanes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if self.lanes not in dot_kernels.FP32_FORMATS:
            return mod
        lanes = self.lanes
        return unfusable_inputs(convert_sites(
            mod, lambda s: winograd_site(s, lanes),
            lambda bb, site, x: emit_winograd(bb, site, x, lanes)))


def emit_winograd(bb: relax.BlockBuilder, site: Site, x: relax.Expr, lanes: int,
                  fmt: dot_kernels.DotFormat | None = None) -> relax.Expr:
    """The three kernels of a Winograd site, F(m x m, 3 x 3) with tile_size's m: float32
    (``fmt`` None), or with ``fmt`` BF16 a bf16 product (the input transform writes bfloat16
    bits, the weights are bf16)."""
    n, out_h, out_w, _ = (int(d) for d in site.var.ty.shape)
    m = tile_size(n, out_h, out_w)
    padding = [int(p) for p in site.call.attrs.padding]
    weight = wk.transform_weight(site.weight(), m, lanes, fmt)
    v = bb.emit_te(wk.input_transform, x, m, padding, fmt is dot_kernels.BF16,
                   primfunc_name_hint="winograd_input")
    suffix = "_bf16" if fmt is dot_kernels.BF16 else ""
    product = bb.emit_te(wk.batched_matmul, v, relax.const(weight),
                         primfunc_name_hint=f"winograd_matmul{suffix}")
    return bb.emit_te(wk.output_transform, product, n, out_h, out_w, m,
                      primfunc_name_hint="winograd_output")


# kOpaque: FuseOps fuses nothing into it
_OPAQUE = 8


def unfusable_inputs(mod: tvm.IRModule) -> tvm.IRModule:
    """The input transforms marked opaque. Left injective, FuseOps fused each into the
    previous conv's output transform (injective too), which then recomputed that transform
    for every tap it read."""
    for gv, func in list(mod.functions_items()):
        if gv.name_hint.startswith("winograd_input") and isinstance(func, tvm.tirx.PrimFunc):
            mod[gv] = func.with_attr("op_pattern", _OPAQUE)
    return mod
