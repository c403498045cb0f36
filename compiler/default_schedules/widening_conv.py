"""Legalization of a float16/bfloat16- or uint8-input ``conv2d`` that sums in float32 with
float32 weights: the input is widened in a stage of its own, before the zero padding, instead
of in every multiply-add.

Why: TOPI's conv casts each input element inside the reduction, so a 3x3 depthwise conv
widens every input vector nine times (once per tap). With the widening as a separate stage,
the schedule can widen a window of input rows once and reuse it across the taps
(cpu_contraction.py: ``depthwise_window``); when the stages are inlined into the conv again
(the other schedules), the kernel computes exactly what TOPI's did.

Which convs: ``DepthwiseHalfInput`` and ``DepthwiseByteInput`` make them (an int8 model's
depthwise convs read the float16 or uint8 tensor their producer wrote; the int8 convs, with
int8 weights and int32 sums, are other kernels). ``HalfInFloat32`` widens the other
half-precision convs at the Relax level already, so their input is float32 here.

Where: handed to ``LegalizeOps`` as part of its customize map (passes/lowering)."""

from __future__ import annotations

import tvm
from tvm import relax, topi

_NARROW = ("float16", "bfloat16", "uint8")
_DEFAULT = tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")


def _widens_input(call: relax.Call) -> bool:
    data, weight = call.args[0].ty, call.args[1].ty
    attrs = call.attrs
    return (isinstance(data, relax.TensorType) and data.dtype in _NARROW
            and isinstance(weight, relax.TensorType) and weight.dtype == "float32"
            and str(attrs.out_dtype) == "float32"
            and attrs.out_layout == attrs.data_layout
            and len(attrs.data_layout) == 4 and len(attrs.kernel_layout) == 4)


def _conv_of_widened(x, w, **conv):
    return topi.nn.conv(topi.cast(x, "float32"), w, **conv)


def legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    if not _widens_input(call):
        return _DEFAULT(bb, call)
    attrs = call.attrs
    return bb.call_te(_conv_of_widened, call.args[0], call.args[1], stride=attrs.strides,
                      padding=attrs.padding, dilation=attrs.dilation, groups=attrs.groups,
                      data_layout=attrs.data_layout, kernel_layout=attrs.kernel_layout,
                      out_dtype="float32", primfunc_name_hint="conv2d")


LEGALIZE_MAP = {"relax.nn.conv2d": legalize_conv2d}
