"""WholeInputPooling: a 2-D max or average pool whose one window covers the whole input
becomes a max or mean over the spatial axes.

Why: transformers' EfficientNet pools its last feature map with ``AvgPool2d(1280,
ceil_mode=True)`` (the hidden size as kernel size) on a 7x7 input; TVM's pooling kernel then
walks the 1280x1280 window for each output channel, checking each tap against the input
bounds, and took 1.1 s of a 1.2 s model. Any window at least as large as the input, with no
padding, reads exactly the input: the pool is a reduction.

Where: with the importer clean-ups, before layout conversion. Only static shapes, no padding,
no dilation, one output position on both axes; everything else stays a pool (padding would
change the average's divisor with ``count_include_pad``)."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...frontends.relax_shapes import static_shape
from ..pattern_rewrite import rewrite_module


def _rewrite(orig, matches, source):
    x = matches[source]
    attrs = orig.attrs
    in_shape, out_shape = static_shape(x), static_shape(orig)
    if in_shape is None or out_shape is None or len(in_shape) != 4:
        return orig
    layout = str(attrs.layout)
    if str(attrs.out_layout) != layout or sorted(layout) != sorted("NCHW"):
        return orig
    axes = [layout.index("H"), layout.index("W")]
    window = [int(k) for k in attrs.pool_size]
    if (any(int(p) for p in attrs.padding) or any(int(d) != 1 for d in attrs.dilation)
            or any(out_shape[a] != 1 for a in axes)
            or any(k < in_shape[a] for k, a in zip(window, axes))):
        return orig
    reduce = relax.op.max if orig.op.name == "relax.nn.max_pool2d" else relax.op.mean
    return reduce(x, axis=axes, keepdims=True)


@tvm.transform.module_pass(opt_level=0, name="WholeInputPooling")
class WholeInputPooling:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        source = wildcard()
        pattern = (is_op("relax.nn.avg_pool2d")(source) | is_op("relax.nn.max_pool2d")(source))
        return rewrite_module(mod, pattern, lambda orig, matches: _rewrite(orig, matches, source))
