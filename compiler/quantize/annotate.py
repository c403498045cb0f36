"""AnnotateInt8: mark each calibrated site for int8 in quantize/dequantize (QDQ) form.

Runs in the quantize phase, after fusion (so combined Q/K/V projections are one site) and
right before RealizeInt8: no FoldConstant may run in between, it would fold the weight's
dequantize back into a float32 constant. The annotated module still computes in float32 with
the quantization error in it (the "fake-quantized" model): it is what realize must match.

For a site ``conv2d(x, W)``:
    xq = quantize(x, sx, zx) : uint8          (per tensor, from the calibrated range)
    conv2d(dequantize(xq, sx, zx), dequantize(Wq, sw, 0))   (Wq int8, sw per output channel)
A site whose range is DYNAMIC (int8-dynamic matmuls) gets sx and zx computed from its
activation's min and max on every run instead (two reductions and scalar arithmetic).
Sites without a range (skipped layers, first/last kept in float32) are left alone."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from aotc.options import DYNAMIC

from ..contraction_sites import main_sites
from ..relax_walk import mutate_functions
from .params import ActivationParams, quantize_weight


def _scalar(value, dtype):
    return relax.const(np.array(value, dtype=dtype))


@relax.expr_functor.mutator
class _Annotator(relax.PyExprMutator):
    def __init__(self, mod, sites, ranges):
        super().__init__(mod)
        self.sites = {site.var: site for site in sites if site.name in ranges}
        self.ranges = ranges
        self.quantized = {}  # activation (remapped) -> its dequantized value: one per tensor

    def visit_var_binding_(self, binding):
        site = self.sites.get(binding.var)
        if site is None:
            super().visit_var_binding_(binding)
            return
        x = self.visit_expr(site.activation)
        if x not in self.quantized:
            scale, zero = self._scale_and_zero(x, self.ranges[site.name])
            xq = self.builder_.emit(relax.op.quantize(x, scale, zero, -1, "uint8"), "xq")
            self.quantized[x] = self.builder_.emit(
                relax.op.dequantize(xq, scale, zero, -1, "float32"), "xdq")
        weight = site.weight()
        wq, sw = quantize_weight(weight, site.weight_axis)
        wdq = self.builder_.emit(relax.op.dequantize(
            relax.const(wq), relax.const(sw), relax.const(np.zeros(sw.shape, np.int32)),
            site.weight_axis, "float32"), "wdq")
        call = relax.Call(site.call.op, [self.quantized[x], wdq], site.call.attrs)
        emit = self.builder_.emit if isinstance(binding.var, relax.DataflowVar) else \
            self.builder_.emit_output
        self.set_var_remap(binding.var, emit(call, binding.var.name))


    def _scale_and_zero(self, x, measured):
        if measured != DYNAMIC:
            params = ActivationParams.from_range(*measured)
            return _scalar(params.scale, "float32"), _scalar(params.zero_point, "int32")
        # ActivationParams.from_range, in Relax, on this run's values
        op, emit = relax.op, self.builder_.emit
        low = emit(op.minimum(op.min(x), _scalar(0.0, "float32")), "x_low")
        high = emit(op.maximum(op.max(x), _scalar(0.0, "float32")), "x_high")
        scale = emit(op.maximum(op.divide(op.subtract(high, low), _scalar(255.0, "float32")),
                                _scalar(1e-12, "float32")), "x_scale")
        zero = emit(op.astype(op.clip(op.round(op.negative(op.divide(low, scale))), 0, 255),
                              "int32"), "x_zero")
        return scale, zero


@tvm.transform.module_pass(opt_level=0, name="AnnotateInt8")
class AnnotateInt8:
    """``ranges``: site name -> (low, high) of its activation (calibrate.py)."""

    def __init__(self, ranges: dict[str, tuple[float, float]]):
        self.ranges = dict(ranges)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites = main_sites(mod)
        if not any(site.name in self.ranges for site in sites):
            return mod
        return mutate_functions(mod, _Annotator(mod, sites, self.ranges))
