"""FoldPadIntoConv: ``conv2d(pad(x, zeros on H and W), w)`` becomes ``conv2d(x, w)`` with the
padding added to the convolution's own (which may be asymmetric: top, left, bottom, right).

Why: models converted from TensorFlow ("SAME" padding) and some exporters pad explicitly;
as its own op the pad is a full copy of the activation, and the convolution schedules read
through their own padding without one (low-intensity ones inline it, compiler/default_schedules).
Only constant zero padding of the spatial axes folds; reflect/edge modes, non-zero values and
padding of the batch or channel axes stay as they are.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..pattern_rewrite import rewrite_module

_SPATIAL_AXES = {"NCHW": (2, 3), "NHWC": (1, 2)}


def _fold(expr, matches, pad_pattern, source):
    pad, conv = matches[pad_pattern], expr
    attrs = conv.attrs
    layout = str(attrs.data_layout)
    if layout not in _SPATIAL_AXES or str(pad.attrs.pad_mode) != "constant" or \
            float(pad.attrs.pad_value) != 0.0:
        return expr
    widths = [int(w) for w in pad.attrs.pad_width]
    h, w = _SPATIAL_AXES[layout]
    for axis in range(len(widths) // 2):
        if axis not in (h, w) and (widths[2 * axis] or widths[2 * axis + 1]):
            return expr
    top, left, bottom, right = [int(p) for p in attrs.padding]
    padding = [top + widths[2 * h], left + widths[2 * w],
               bottom + widths[2 * h + 1], right + widths[2 * w + 1]]
    return relax.op.nn.conv2d(matches[source], conv.args[1], strides=attrs.strides,
                              padding=padding, dilation=attrs.dilation, groups=attrs.groups,
                              data_layout=layout, kernel_layout=attrs.kernel_layout,
                              out_layout=attrs.out_layout, out_dtype=attrs.out_dtype)


@tvm.transform.module_pass(opt_level=0, name="FoldPadIntoConv")
class FoldPadIntoConv:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        source = wildcard()
        pad = is_op("relax.nn.pad")(source)
        conv = is_op("relax.nn.conv2d")(pad, wildcard())
        return rewrite_module(mod, conv, lambda expr, m: _fold(expr, m, pad, source))
