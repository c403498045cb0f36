"""FoldIntoQuantize: a quantize absorbs the clamps and the affine scale and offset in front
of it.

Why: an int8 layer's epilogue ends ``acc * scale[c] + offset[c] -> relu / relu6 -> quantize``
(RealizeInt8; a float32 depthwise conv's ends ``conv + bias[c]``), and in the small int8 convs
of mobile nets the epilogue costs as much as the dot products (MobileNetV2's 24->144 expand:
6 ``vpdpbusd`` against ~10 epilogue instructions per output vector). quantize(x) is
clip(round(x / s) + zp), so:

1. A clamp whose bound the quantize maps to its own lowest (highest) code does nothing:
   quantize is monotone, so quantize(max(x, a)) = max(quantize(x), quantize(a)) = quantize(x)
   when quantize(a) is the lowest code; min(x, b) likewise with the highest. relu before a
   quantize with zero point 0 and relu6 before one calibrated on [0, <= 6] both go. Exact.
2. quantize(a * k + o) = clip(round(a * k' + o'), codes) with k' = k / s and o' = o / s + zp
   folded at compile time: one multiply-add where there were a multiply, an add, a multiply by
   1 / s and an add of zp (default_schedules/reciprocal_quantize.py lowers a quantize that way). The
   constants are rounded once instead of twice, so a code can be one step apart where
   a * k / s lies within a rounding of a half-way point, as with reciprocal_quantize's.
   Where a is a float32 conv with constant weights (the depthwise convs), k' goes into the
   weights and the epilogue keeps only the add.

How: on the dataflow bindings of ``main``, ``quantize(v)`` with one constant scale and zero
point: clamps in front of it dropped while the rule above holds, then v = ``a * k + o``,
``a * k`` or ``a + o`` (k, o constants of one number or one per channel of the last axis,
each used only here) becomes the ops the quantize lowers to, with the folded constants.

Where: quantize phase, after RealizeInt8, DepthwiseHalfInput (the epilogues exist then) and
before LegalizeOps."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..default_schedules.reciprocal_quantize import reciprocals
from ..frontends.relax_shapes import static_shape
from ..relax_walk import (
    constant_values,
    has_main,
    mutate_functions,
    one_value,
    op_name,
    single_use_values,
)

_CODES = {"uint8": (0, 255), "int8": (-128, 127)}


class _Quantize:
    """One quantize's scale, zero point and codes (scalar scale and zero point only)."""

    def __init__(self, call: relax.Call):
        self.call = call
        self.scale, self.zero = one_value(call.args[1]), one_value(call.args[2])
        self.codes = _CODES.get(str(call.attrs.out_dtype))
        self.ok = (self.scale is not None and self.zero is not None and self.codes is not None
                   and np.isfinite(self.scale) and self.scale > 0)

    def code(self, value: float) -> float:
        """The code the quantize gives ``value``, before its clip, computed as its kernel
        does (default_schedules/reciprocal_quantize.py: float32 times the reciprocal, half to
        even)."""
        (reciprocal,) = reciprocals(np.asarray([self.scale]))
        return float(np.rint(np.float32(value) * reciprocal)) + self.zero

    def is_lowest(self, bound: float) -> bool:
        return self.code(bound) <= self.codes[0]

    def is_highest(self, bound: float) -> bool:
        return self.code(bound) >= self.codes[1]


def clamp_input(value, quantize: _Quantize):
    """The clamp's input when ``value`` is a clamp the quantize makes redundant, else None."""
    name = op_name(value)
    if name == "relax.nn.relu":
        return value.args[0] if quantize.is_lowest(0.0) else None
    if name == "relax.clip":
        low, high = one_value(value.args[1]), one_value(value.args[2])
        if low is not None and high is not None and quantize.is_lowest(low) \
                and quantize.is_highest(high):
            return value.args[0]
        return None
    if name in ("relax.maximum", "relax.minimum"):
        bound = one_value(value.args[1])
        if bound is None:
            return None
        redundant = quantize.is_lowest(bound) if name == "relax.maximum" \
            else quantize.is_highest(bound)
        return value.args[0] if redundant else None
    return None


def _constant_operand(value, op: str):
    """(x, c) of ``op(x, c)`` with c a finite constant whose values broadcast within x's shape
    (one number, or one per channel of the last axis), else None."""
    if op_name(value) != op:
        return None
    c, shape = constant_values(value.args[1]), static_shape(value.args[0])
    if c is None or shape is None or not shape or not np.all(np.isfinite(c)):
        return None
    if c.size != 1 and (c.shape[-1] != shape[-1] or c.size != shape[-1] or c.ndim > len(shape)):
        return None
    return value.args[0], c


def affine_input(value, values: dict, single_use) -> tuple | None:
    """(a, k, o) when ``value`` is ``a * k + o``, ``a * k`` or ``a + o`` with constants k and o
    (each one number or one per channel; the inner multiply used only here), else None."""
    k, o = 1.0, 0.0
    added = _constant_operand(value, "relax.add")
    if added is not None:
        value, o = values.get(added[0]), added[1]
        if value is None or value not in single_use:
            return added[0], k, o
    multiplied = _constant_operand(value, "relax.multiply")
    if multiplied is not None:
        return multiplied[0], multiplied[1], o
    return (added[0], k, o) if added is not None else None


def requantized(a, k, o, quantize: _Quantize, producer=None) -> relax.Expr:
    """quantize(a * k + o) with the constants folded: quantize(a * k' + o', 1, 0) with
    k' = k / s and o' = o / s + zero point, which reciprocal_quantize lowers to
    clip(round(a * k' + o')) (one multiply-add: LLVM contracts the two). ``producer``: what
    ``a`` is bound to, when used only here; a float32 conv's takes k' into its weights."""
    op = relax.op
    scale = np.asarray(np.asarray(k) / quantize.scale, np.float32)
    offset = np.asarray(np.asarray(o) / quantize.scale + quantize.zero, np.float32)
    y = a if np.all(scale == 1) else weights_scaled(producer, scale)
    if y is None:
        y = op.multiply(a, relax.const(scale))
    y = y if np.all(offset == 0) else op.add(y, relax.const(offset))
    return op.quantize(y, relax.const(np.float32(1.0)), relax.const(np.int32(0)), -1,
                       str(quantize.call.attrs.out_dtype))


def weights_scaled(conv, scale: np.ndarray) -> relax.Call | None:
    """``conv(x, W) * scale`` as ``conv(x, W * scale)`` (one number or one per output
    channel) when ``conv`` is a float32 NHWC/HWIO conv2d with a constant weight, else None:
    a depthwise conv's dequantization multiply leaves its epilogue."""
    if op_name(conv) != "relax.nn.conv2d" or conv.attrs.kernel_layout != "HWIO" \
            or conv.attrs.out_layout != "NHWC" or str(conv.ty.dtype) != "float32":
        return None
    weight = constant_values(conv.args[1])
    if weight is None or conv.args[1].ty.dtype != "float32" or weight.ndim != 4 or \
            scale.size not in (1, weight.shape[-1]):
        return None
    scaled = (weight * scale.reshape(-1).astype(np.float64)).astype(np.float32)
    return relax.Call(conv.op, [conv.args[0], relax.const(scaled)], conv.attrs)


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.values = relax.analysis.get_var2val(mod["main"])
        self.single_use = single_use_values(mod)

    def _single_use_value(self, var):
        value = self.values.get(var)
        return value if value is not None and value in self.single_use else None

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        quantize = _Quantize(call) if op_name(call) == "relax.quantize" else None
        if quantize is None or not quantize.ok:
            return call
        var = call.args[0]
        while True:
            value = self._single_use_value(var)
            inner = clamp_input(value, quantize) if value is not None else None
            if inner is None:
                break
            var = inner
        affine = affine_input(value, self.values, self.single_use) if value is not None \
            else None
        if affine is not None:
            producer = self._single_use_value(affine[0])
            return self.builder_.normalize(requantized(*affine, quantize, producer))
        if var.same_as(call.args[0]):
            return call
        return self.builder_.normalize(relax.Call(call.op, [var, *call.args[1:]], call.attrs))


@tvm.transform.module_pass(opt_level=0, name="FoldIntoQuantize")
class FoldIntoQuantize:
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not has_main(mod):
            return mod
        return relax.transform.DeadCodeElimination()(mutate_functions(mod, _Folder(mod)))
