"""Conv1dAsConv2d: a 1-D convolution (NCW, OIW) becomes a 2-D one over a unit height:
``squeeze(conv2d(expand_dims(x, 2), expand_dims(w, 2)), 2)``.

Why: the layout conversion, the packed kernels (PrepackWeights) and their schedules know
conv2d only; conv1d reached ``Contraction`` unpacked in NCW, at a third of the rate of its
packed conv2d twins.
Speech and time-series models (Whisper, wav2vec 2.0, temporal CNNs) open with such layers.

Where: with the importer clean-ups, before the layout conversion. Constant weights fold to
OIHW; the strides, padding and dilation carry over along the width, with a unit height."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..pattern_rewrite import rewrite_module


def _pair(values) -> list[int]:
    return [int(v) for v in values]


def _rewrite(orig, matches, data, weight):
    attrs = orig.attrs
    if (str(attrs.data_layout) != "NCW" or str(attrs.kernel_layout) != "OIW"
            or str(attrs.out_layout) not in ("NCW", "")):
        return orig
    x, w = matches[data], matches[weight]
    padding = _pair(attrs.padding)
    left, right = (padding * 2)[:2] if len(padding) == 1 else padding
    out_dtype = None if str(attrs.out_dtype) in ("", "None", "void") else str(attrs.out_dtype)
    y = relax.op.nn.conv2d(relax.op.expand_dims(x, [2]), relax.op.expand_dims(w, [2]),
                           strides=[1, _pair(attrs.strides)[0]], padding=[0, left, 0, right],
                           dilation=[1, _pair(attrs.dilation)[0]], groups=int(attrs.groups),
                           data_layout="NCHW", kernel_layout="OIHW", out_dtype=out_dtype)
    return relax.op.squeeze(y, [2])


@tvm.transform.module_pass(opt_level=0, name="Conv1dAsConv2d")
class Conv1dAsConv2d:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        data, weight = wildcard(), wildcard()
        pattern = is_op("relax.nn.conv1d")(data, weight)
        return rewrite_module(mod, pattern,
                              lambda orig, matches: _rewrite(orig, matches, data, weight))
