"""ConvertBF16: ``--precision bf16``, float32 convolutions and matmuls with constant weights run
as bfloat16 dot products with float32 accumulation.

Runs in the quantize phase, after RealizeInt8 (layers int8 took are no longer float32
contractions; a model can mix both: --skip-layers left out of int8 then go bf16), before
lowering. Each site (contraction_sites.py: NHWC conv2d of one group, matmul with a 2-D constant weight)
becomes
    xb  = to_bf16_bits(x)                                 uint16, round to nearest even
    y   = bf16 kernel(xb, prepacked bf16 W)               float32 sums (compiler/dot_kernels.py)
and what followed (bias, activation, residual add) stays float32 in the kernel's epilogue.
FuseOps puts ``to_bf16_bits`` into the producer's epilogue, so that the activation travels
as 2 bytes a value. The weights are rounded to bfloat16 and packed at compile time.

Which sites, and why not all: on this machine (Sapphire Rapids, AVX512-BF16) ``vdpbf16ps``
reached ~100 GFLOP/s a core whatever the register tile, where prepacked float32 FMAs
(passes/layout/prepack_weights.py) reach ~170: bf16 pays only where streaming the weights
bounds the kernel, i.e. few output rows share each weight. Packed matmuls, fp32 / bf16 time
(2 threads, /tmp/proto time_evaluator): 2048x1024 (8.4 MB of fp32 weights) at 1, 2, 4, 8, 16
rows 1.96, 2.34, 1.59, 0.90, 0.78; 768x768 (2.4 MB) 1.97, 1.44, 0.74, 0.65; 512x1000 (2 MB)
0.97, 1.02, 0.87, 0.70; 3x3 convs at 14x14 and 7x7 spatial 0.67 and 0.72. So a site goes
bf16 when its float32 weight holds at least BYTES_PER_ROW (2 MB) for each output row (a
row: one output pixel of a conv, one row of a matmul's output); the others stay float32, and
get packed. At batch 1 that is the classifiers and decoder projections, not the convolutions
of a CNN. ``--explain`` counts the kernels made.

What stays float32, and why: depthwise/grouped convolutions (no dot product over channels to
pack), matmuls of two activations (attention: their score sums are where precision matters
and they have no constant operand to prepack), normalization, softmax and every elementwise
op. Accuracy: bfloat16 keeps 8 bits of mantissa (relative error 2^-9 per operand); the sums
are float32, so errors do not grow with the reduction length as bf16 sums would."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .. import dot_kernels
from ..frontends.relax_shapes import static_shape
from ..contraction_sites import Site
from ..passes.layout.prepack_weights import convert_sites, site_kind, site_packed_call

BYTES_PER_ROW = 2 << 20


def _weight_bytes_per_row(site: Site) -> float:
    weight = 4 * int(np.prod([int(d) for d in site.call.args[1].value.shape]))
    return weight / int(np.prod(static_shape(site.var)[:-1]))


def _emit_bf16(bb: relax.BlockBuilder, site: Site, x: relax.Expr) -> relax.Expr:
    xb = bb.emit_te(dot_kernels.to_bf16_bits, x, primfunc_name_hint="to_bf16")
    return bb.emit_te(*site_packed_call(site, xb, dot_kernels.BF16),
                      primfunc_name_hint=f"{site_kind(site)}_bf16")


@tvm.transform.module_pass(opt_level=0, name="ConvertBF16")
class ConvertBF16:
    """``enabled`` False (precision fp32) leaves the module as it is; ``bytes_per_row``:
    sites with less float32 weight per output row stay float32 (0: every site goes bf16)."""

    def __init__(self, enabled: bool, bytes_per_row: float = BYTES_PER_ROW):
        self.enabled, self.bytes_per_row = enabled, bytes_per_row

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not self.enabled:
            return mod
        return convert_sites(mod, lambda s: _weight_bytes_per_row(s) >= self.bytes_per_row,
                             _emit_bf16)
