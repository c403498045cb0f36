"""ConvertBF16: ``--precision bf16``, float32 convolutions and matmuls with constant weights run
as bfloat16 dot products with float32 accumulation.

Runs in the quantize phase, after RealizeInt8 (layers int8 took are no longer float32
contractions; a model can mix both: --skip-layers left out of int8 then go bf16), before
lowering. Each site (sites.py: NHWC conv2d of one group, matmul with a 2-D constant weight)
becomes
    xb  = to_bf16_bits(x)                                 uint16, round to nearest even
    y   = bf16 kernel(xb, prepacked bf16 W)               float32 sums (compiler/dot_kernels.py)
and what followed (bias, activation, residual add) stays float32 in the kernel's epilogue.
FuseOps puts ``to_bf16_bits`` into the producer's epilogue, so that the activation travels
as 2 bytes a value. The weights are rounded to bfloat16 and packed at compile time.

Which sites, and why not all: on this machine (Sapphire Rapids, AVX512-BF16) ``vdpbf16ps``
reached ~100 GFLOP/s a core whatever the register tile, where float32 FMAs reach ~150 on
cache-resident weights: bf16 pays where weight traffic bounds the kernel, not arithmetic.
Kernel pairs measured here (fp32 / bf16 GFLOP/s, /tmp/proto, time_evaluator): matmul
128x768x3072 (9.4 MB of fp32 weights) 52 / 93, 49x512x2048 (4 MB) 70 / 94, 1x512x1000 (2 MB)
13 / 47, 3x3 conv 14x14x256 (2.4 MB) 73 / 104; but 197x192x576 (0.44 MB) 127 / 76, 1x1 conv
56x56 64->256 (64 KB) 113 / 75, 3x3 conv 56x56x64 (147 KB) 150 / 98. So a site goes bf16
when its float32 weight is at least MIN_WEIGHT_BYTES (1 MB, half this core's 2 MB L2); the
others stay float32. ``--explain`` counts the kernels made.

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
from ..relax_walk import mutate_functions
from .sites import Site, find_sites

MIN_WEIGHT_BYTES = 1 << 20


def _weight_bytes(site: Site) -> int:
    return 4 * int(np.prod([int(d) for d in site.call.args[1].value.shape]))


def _kernel(site: Site, xb: relax.Expr):
    """(te function, args...) for emit_te: the bf16 kernel of ``site`` on bits ``xb``."""
    weight = site.call.args[1].value.numpy()
    if site.call.op.name == "relax.matmul":
        return (dot_kernels.matmul, xb,
                relax.const(dot_kernels.pack_matmul_weight(weight, dot_kernels.BF16)),
                weight.shape[1], 0)
    attrs = site.call.attrs
    return (dot_kernels.conv2d_nhwc, xb,
            relax.const(dot_kernels.pack_conv_weight(weight, dot_kernels.BF16)),
            weight.shape[3], [int(s) for s in attrs.strides], [int(p) for p in attrs.padding],
            [int(d) for d in attrs.dilation], 0)


@relax.expr_functor.mutator
class _BF16Converter(relax.PyExprMutator):
    def __init__(self, mod, sites: dict):
        super().__init__(mod)
        self.sites = sites          # binding var -> Site

    def visit_var_binding_(self, binding):
        site = self.sites.get(binding.var)
        if site is None:
            super().visit_var_binding_(binding)
            return
        xb = self.builder_.emit_te(dot_kernels.to_bf16_bits, self.visit_expr(site.activation),
                                   primfunc_name_hint="to_bf16")
        kind = "conv2d" if site.call.op.name == "relax.nn.conv2d" else "matmul"
        y = self.builder_.emit_te(*_kernel(site, xb), primfunc_name_hint=f"{kind}_bf16")
        self.set_var_remap(binding.var, self._bind(binding.var, y))

    def _bind(self, var, value):
        if isinstance(var, relax.DataflowVar):
            return value
        return self.builder_.emit_output(value, var.name)


@tvm.transform.module_pass(opt_level=0, name="ConvertBF16")
class ConvertBF16:
    """``enabled`` False (precision fp32) leaves the module as it is; ``min_weight_bytes``:
    smaller float32 weights stay float32 (0: every site goes bf16)."""

    def __init__(self, enabled: bool, min_weight_bytes: int = MIN_WEIGHT_BYTES):
        self.enabled, self.min_weight_bytes = enabled, min_weight_bytes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not self.enabled or "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
            return mod
        sites = {s.var: s for s in find_sites(mod["main"])
                 if _weight_bytes(s) >= self.min_weight_bytes}
        if not sites:
            return mod
        return relax.transform.DeadCodeElimination()(
            mutate_functions(mod, _BF16Converter(mod, sites)))
