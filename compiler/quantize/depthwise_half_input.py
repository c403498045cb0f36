"""DepthwiseHalfInput: in an int8 model, the float32 depthwise convolutions read float16.

Why: depthwise convs have no int8 kernel (contraction_sites.py: without a dot product over
channels, converting bytes to float32 per tap cost more than reading fewer of them saved) and
stay float32. In MobileNetV2 int8 they sit between two int8 convs: the expand conv writes a
float32 tensor (112x112x96: 4.8 MB, more than L2) that the depthwise conv reads nine times per
output (once per tap). Written as float16, the tensor is half the bytes, and the depthwise
kernel widens each input vector with one instruction (vcvtph2ps on x86) before its float32
multiply-adds; sums stay float32. (Stride-1 kernels widen each input once per tap row into a
window the taps share: compiler/default_schedules/cpu_depthwise.py, with widening_conv.py.) The
rounding
(2^-11 relative) is far below the int8 error around it, which is why this runs only when int8
sites were annotated (``enabled``).

How: ``conv2d(x, W)`` with groups = channels, NHWC, float32 ``x`` used by this conv alone
becomes ``conv2d(astype(x, float16), W, out_dtype=float32)``. FuseOps puts the cast into the
producer's epilogue (the expand conv's requantization), so no float32 copy is written.

Where: quantize phase, after RealizeInt8 (the expand conv is already an int8 kernel) and
DepthwiseByteInput, which gives the convs whose input is clipped to [0, hi] (ReLU6) a uint8
input instead: this pass takes the others (SiLU, hardswish, unclipped ReLU).

Measurements: docs/design/measurements.md#compilerquantizedepthwise_half_inputpy."""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontends.relax_shapes import static_shape
from ..passes.lowering.half_in_float32 import with_float32_out
from ..relax_walk import RewriteWhenEnabled, op_name, single_use_values


def is_float32_depthwise(call: relax.Expr) -> bool:
    """A float32 NHWC/HWIO conv2d with groups = channels > 1 and a static input shape."""
    if op_name(call) != "relax.nn.conv2d":
        return False
    attrs, shape = call.attrs, static_shape(call.args[0])
    return (attrs.data_layout == "NHWC" and attrs.kernel_layout == "HWIO"
            and shape is not None and len(shape) == 4 and int(attrs.groups) == shape[3] > 1
            and call.args[0].ty.dtype == "float32" and call.args[1].ty.dtype == "float32")


@relax.expr_functor.mutator
class DepthwiseInputs(relax.PyExprMutator):
    """Each float32 depthwise conv whose input has no other user (narrowing an input with other
    users would write the tensor twice) becomes ``narrow(builder, conv, value, values)``, where
    ``value`` is what the input is bound to; None leaves the conv as it is."""

    def __init__(self, mod, narrow):
        super().__init__(mod)
        self.values = relax.analysis.get_var2val(mod["main"])
        self.single_use = single_use_values(mod)
        self.narrow = narrow

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        original = call
        call = super().visit_call_(call)
        value = self.values.get(original.args[0])
        if not is_float32_depthwise(call) or value not in self.single_use:
            return call
        narrowed = self.narrow(self.builder_, call, value, self.values)
        return call if narrowed is None else narrowed


def _half_input(builder, call: relax.Call, _value, _values) -> relax.Expr:
    half = builder.emit(relax.op.astype(call.args[0], "float16"), "x_half")
    return relax.Call(call.op, [half, call.args[1]], with_float32_out(call.attrs))


@tvm.transform.module_pass(opt_level=0, name="DepthwiseHalfInput")
class DepthwiseHalfInput(RewriteWhenEnabled):
    """``enabled``: int8 sites were annotated (compile options carry calibrated ranges)."""

    rewriter = staticmethod(lambda mod: DepthwiseInputs(mod, _half_input))
