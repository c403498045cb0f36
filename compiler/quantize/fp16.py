"""ConvertFP16: ``--precision fp16``, float32 convolutions and matmuls with constant weights run
as float16 kernels on AVX512-FP16 (``vfmadd231ph``: 32 half-precision multiply-adds an
instruction, twice a float32 FMA's).

Runs in the quantize phase, after RealizeInt8 and ConvertBF16 (a layer int8 took is no longer
a float32 contraction), before lowering. Each site (contraction_sites.py) becomes
    xh  = astype(x, float16)                         round to nearest even
    y   = fp16 kernel(xh, prepacked fp16 W)          float16 sums, widened to float32 on the
                                                     way out (compiler/dot_kernels.py, FP16)
and what followed (bias, activation, residual add) stays float32 in the kernel's epilogue.
FuseOps puts the ``astype`` into the producer's epilogue, so the activation travels as 2 bytes.

Accumulation is float16, as XNNPACK's and MLAS's f16 GEMMs on ARM do: that is where the
speed is. Widening every product into float32 sums (the "fp32 accumulation" of GPU tensor
cores) has no instruction on x86 short of a convert per product, which would run slower than
the float32 kernels. Sums of K products carry a relative error growing like sqrt(K) * 2^-11,
so the long reductions are where accuracy goes: a site whose reduction is longer than
``max_reduction`` (default 4608: a 3x3 conv over 512 channels) stays float32 (it is packed
as float32 then). So do the sites PrepackWeights would not pack at 32 lanes (output channels
that do not fill blocks of 32, rows without a tile-sized divisor: prepack_weights.packs_well).
tests/quantize/test_fp16.py checks the kernels and a model; accuracy on real models:
docs/design/measurements.md#compilerquantizefp16py.

What stays float32: depthwise/grouped convolutions, matmuls of two activations (attention),
normalization, softmax, elementwise ops (as with bf16; quantize/bf16.py says why)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .. import dot_kernels
from ..contraction_sites import Site
from ..passes.layout.prepack_weights import convert_sites, packs_well, site_kind, site_packed_call

MAX_REDUCTION = 4608


def reduction_length(site: Site) -> int:
    """Products summed into one output: KH*KW*IC of a conv2d (HWIO), K of a matmul."""
    shape = [int(d) for d in site.call.args[1].value.shape]
    return int(np.prod(shape[:-1]))


def _emit_fp16(bb: relax.BlockBuilder, site: Site, x: relax.Expr) -> relax.Expr:
    xh = bb.emit(relax.op.astype(x, "float16"))
    return bb.emit_te(*site_packed_call(site, xh, dot_kernels.FP16),
                      primfunc_name_hint=f"{site_kind(site)}_fp16")


@tvm.transform.module_pass(opt_level=0, name="ConvertFP16")
class ConvertFP16:
    """``enabled`` False (another precision) leaves the module as it is."""

    def __init__(self, enabled: bool, max_reduction: int = MAX_REDUCTION):
        self.enabled, self.max_reduction = enabled, max_reduction

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not self.enabled:
            return mod
        return convert_sites(mod, lambda s: reduction_length(s) <= self.max_reduction
                             and packs_well(s, dot_kernels.FP16.lanes), _emit_fp16)
