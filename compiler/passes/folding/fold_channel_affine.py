"""FoldChannelAffine: per-output-channel scales and shifts after a convolution or a matmul with
constant weights go into those weights and one bias add.

Why: inference BatchNorm (after DecomposeOpsForInference) and the Caffe2-era
subtract/divide/multiply/add chains that stand for it stay as four elementwise ops on every
conv output; FuseOps makes them an epilogue, but each still reads its constant and does its
arithmetic per element at run time. Folded, a conv + BN is a conv with different weights plus
one bias add (which fuses as before).

How: dataflow-pattern rewrites, applied until nothing changes, on ``y = conv2d(x, W)`` (NCHW /
OIHW) or ``y = matmul(x, W)`` (2-D W) with W constant:
  y * c, y / c              -> the same op with W scaled per output channel
  (y + b) * c, (y + b) / c  -> y * c + b * c, y / c + b / c   (then the rule above)
  y - b                     -> y + (-b)
  (y + b1) + b2             -> y + (b1 + b2)
where c, b are constants that vary only along the output-channel axis (axis 1 of NCHW, the
last axis of a matmul) - anything else is left alone.

Where: in the simplify phase after FoldConstant, before the layout conversion (which then
pre-transposes the folded weights).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ...relax_walk import single_use_values
from ..pattern_rewrite import rewrite_module

MAX_ROUNDS = 8


def _value(const) -> np.ndarray:
    return const.value.numpy()


def _per_channel(const, out_rank: int, channel_axis: int, channels: int) -> np.ndarray | None:
    """The constant as a [channels] vector if it varies only along the channel axis."""
    value = _value(const)
    if value.ndim > out_rank:
        return None
    full = value.reshape((1,) * (out_rank - value.ndim) + value.shape)
    for axis, size in enumerate(full.shape):
        if axis != channel_axis % out_rank and size != 1:
            return None
    if full.shape[channel_axis % out_rank] not in (1, channels):
        return None
    return np.broadcast_to(full.reshape(-1), (channels,)).copy()


def _layout(call: relax.Call):
    """(channel axis of the output, weight axis of the output channels, channels) or None."""
    weight = call.args[1].value  # its shape only: reading the values would copy them all
    if call.op.name == "relax.nn.conv2d":
        attrs = call.attrs
        if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW" or \
                str(attrs.out_layout) != "NCHW":
            return None
        return 1, 0, int(weight.shape[0])
    if call.op.name == "relax.matmul" and len(weight.shape) == 2:
        return -1, 1, int(weight.shape[1])
    return None


def _weight_scale(producer: relax.Call, const) -> np.ndarray | None:
    """``const`` as a float64 factor shaped to multiply the producer's weight per output
    channel, or None when it cannot be folded (not per-channel, other dtype, integer op)."""
    layout = _layout(producer)
    out_rank = producer.ty.ndim
    dtype = str(producer.ty.dtype)
    if layout is None or out_rank < 1 or str(const.ty.dtype) != dtype or \
            not dtype.startswith(("float", "bfloat")):
        return None
    channel_axis, weight_axis, channels = layout
    scale = _per_channel(const, out_rank, channel_axis, channels)
    if scale is None:
        return None
    shape = [1] * _value(producer.args[1]).ndim
    shape[weight_axis] = channels
    return scale.reshape(shape).astype(np.float64)


def _scaled(producer: relax.Call, const, divide: bool) -> relax.Expr | None:
    scale = _weight_scale(producer, const)
    if scale is None:
        return None
    weight = _value(producer.args[1])
    folded = (weight / scale) if divide else (weight * scale)
    new_weight = relax.const(folded.astype(weight.dtype), str(weight.dtype))
    return relax.Call(producer.op, [producer.args[0], new_weight], producer.attrs,
                      producer.ty_args)


def _const_like(value: np.ndarray, const) -> relax.Expr:
    dtype = str(const.ty.dtype)
    return relax.const(np.asarray(value, dtype=dtype), dtype)


class _Rules:
    """The patterns and their rewriters; each returns the original call when it does not apply."""

    def __init__(self):
        x = wildcard()
        self.producer = (is_op("relax.nn.conv2d")(x, is_const())
                         | is_op("relax.matmul")(x, is_const()))
        self.c = is_const()
        self.b = is_const()
        self.shifted = is_op("relax.add")(self.producer, self.b)
        self.fired = 0  # rewrites done so far: FoldChannelAffine stops when a round adds none
        self.single_use: set = set()  # bound values read by exactly one binding (see below)

    def _only_use(self, matches, *patterns) -> bool:
        """Whether each matched intermediate feeds only this chain. Folding a scale into a
        producer that has other readers duplicates the conv/matmul: BERT's GELU reads the FFN
        matmul's output three times (x, x/sqrt(2) in erf, x*0.5) and each got its own scaled
        copy of the 768x3072 matmul."""
        return all(p not in matches or matches[p] in self.single_use for p in patterns)

    def all(self):
        p, c, shifted = self.producer, self.c, self.shifted
        return [
            (is_op("relax.multiply")(p, c) | is_op("relax.multiply")(c, p), self._scale(False)),
            (is_op("relax.divide")(p, c), self._scale(True)),
            (is_op("relax.multiply")(shifted, c), self._distribute(relax.op.multiply, np.multiply)),
            (is_op("relax.divide")(shifted, c), self._distribute(relax.op.divide, np.divide)),
            (is_op("relax.subtract")(p | shifted, c), self._negate),
            (is_op("relax.add")(shifted, c), self._merge_shifts),
        ]

    def _scale(self, divide: bool):
        def rewrite(orig, matches):
            if not self._only_use(matches, self.producer):
                return orig
            folded = _scaled(matches[self.producer], matches[self.c], divide)
            if folded is None:
                return orig
            self.fired += 1
            return folded
        return rewrite

    def _distribute(self, op, numpy_op):
        def rewrite(orig, matches):
            producer, shift, c = matches[self.producer], matches[self.b], matches[self.c]
            if not self._only_use(matches, self.producer, self.shifted):
                return orig
            if _weight_scale(producer, c) is None:  # the scale rule will fold it next
                return orig
            self.fired += 1
            return relax.op.add(op(producer, c), _const_like(numpy_op(_value(shift), _value(c)),
                                                              shift))
        return rewrite

    def _negate(self, orig, matches):
        c = matches[self.c]
        self.fired += 1
        return relax.op.add(orig.args[0], _const_like(-_value(c), c))

    def _merge_shifts(self, orig, matches):
        if not self._only_use(matches, self.shifted):
            return orig
        first, second = matches[self.b], matches[self.c]
        merged = np.broadcast_shapes(_value(first).shape, _value(second).shape)
        if str(first.ty.dtype) != str(second.ty.dtype) or \
                merged not in (_value(first).shape, _value(second).shape):
            return orig  # never grow a constant beyond the larger of the two
        self.fired += 1
        return relax.op.add(matches[self.producer],
                            _const_like(_value(first) + _value(second), first))


@tvm.transform.module_pass(opt_level=0, name="FoldChannelAffine")
class FoldChannelAffine:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        rules = _Rules()
        patterns = rules.all()
        for _round in range(MAX_ROUNDS):
            fired = rules.fired
            for pattern, rewriter in patterns:
                rules.single_use = single_use_values(mod)
                mod = rewrite_module(mod, pattern, rewriter)
            if rules.fired == fired:
                break
        return mod
