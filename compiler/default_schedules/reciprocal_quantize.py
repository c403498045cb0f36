"""Legalization of ``relax.quantize`` with one constant scale: multiply by its reciprocal
instead of dividing by it.

Why: TVM lowers ``quantize`` to ``round(x / scale)``, and without fast-math LLVM keeps the
division: one ``vdivps`` per output vector, ~10 cycles each on AVX-512 against half a cycle for
a multiply. In an int8 model every layer ends in a quantize (the next layer's input), so the
division sat in the epilogue of every kernel; a depthwise tile (8 divisions against 72
multiply-adds) spent more time dividing than convolving.

On LLVM targets the rounding is ``llvm.lrint`` of the clipped value (half to even, as
``round``), which x86 converts in one instruction (``vcvtps2dq``, where ``round`` then the
conversion took ``vrndscaleps`` + ``vcvttps2dq``). Clipping before rounding, with the zero
point added to the integer after, gives the same codes: the bounds minus the zero point are
integers.

Exactness: ``x * fl(1 / scale)`` differs from ``x / scale`` by at most one unit in the last
place, so ``round`` can come out one quantization step apart where ``x / scale`` lies within
that of a half-way point: rare, and within the step-size tolerance the int8 results are held
to (onnxruntime's QuantizeLinear divides, so a pre-quantized model can differ from it there).

Per-channel constant scales (an imported QuantizeLinear with a per-axis scale) get a constant
vector of reciprocals, read per channel. Scale 1 and zero point 0 (FoldIntoQuantize's, which
folds both into the multiply-add in front) lower to no multiply and no add.

Where: handed to ``LegalizeOps`` as part of its customize map (passes/lowering). Scales or
zero points that are not constants and non-float32 inputs keep TVM's lowering."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx

from ..relax_walk import constant_values, one_value

_DEFAULT = tvm.ir.Op.get("relax.quantize").get_attr("FLegalize")


def _channel_values(expr: relax.Expr, channels: int) -> np.ndarray | None:
    """A constant's values as one per channel: one number repeated, or a [C] vector."""
    values = constant_values(expr)
    if values is None:
        return None
    values = values.reshape(-1)
    if values.size == 1:
        return np.full(channels, values[0])
    return values if values.size == channels else None


def _quantize_by_reciprocal(x: te.Tensor, reciprocal, zero_point, out_dtype, axis: int):
    """``reciprocal``/``zero_point``: floats, or [C] tensors indexed along ``axis``."""
    low, high = (float(v) for v in (tirx.min_value(out_dtype).value,
                                    tirx.max_value(out_dtype).value))
    rounds_on_conversion = _converts_rounding() and not isinstance(zero_point, te.Tensor)

    def per_channel(value, i):
        return value[i[axis]] if isinstance(value, te.Tensor) else tirx.const(value, "float32")

    def compute(*i):
        value = x(*i)
        if isinstance(reciprocal, te.Tensor) or reciprocal != 1.0:  # FoldIntoQuantize's: 1
            value = value * per_channel(reciprocal, i)
        if rounds_on_conversion:
            # clip(round(v) + zp, low, high) = round(clip(v, low - zp, high - zp)) + zp
            value = te.max(te.min(value, tirx.const(high - zero_point, "float32")),
                           tirx.const(low - zero_point, "float32"))
            code = tirx.call_llvm_pure_intrin("int32", "llvm.lrint", value)
            if zero_point != 0.0:
                code = code + tirx.const(int(zero_point), "int32")
            return code.astype(out_dtype)
        value = te.round(value)
        if isinstance(zero_point, te.Tensor) or zero_point != 0.0:
            value = value + per_channel(zero_point, i)
        return te.max(te.min(value, tirx.const(high, "float32")),
                      tirx.const(low, "float32")).astype(out_dtype)

    return te.compute(x.shape, compute, name="quantized")


def _converts_rounding() -> bool:
    """Whether the kernels are LLVM's (CPU targets): ``llvm.lrint`` rounds half to even as
    ``round`` does and converts in the same instruction (x86 ``vcvtps2dq``, where ``round``
    then a conversion are ``vrndscaleps`` + ``vcvttps2dq``). Other code generators (CUDA's
    C source) have no LLVM intrinsics."""
    target = tvm.target.Target.current(allow_none=True)
    return target is not None and target.kind.name == "llvm"


def reciprocals(scale: np.ndarray) -> np.ndarray | None:
    """fl(1 / fl(scale)) per element, or None when a scale is zero or not finite."""
    scale = scale.astype(np.float32).astype(np.float64)
    if not np.all(np.isfinite(scale)) or np.any(scale == 0):
        return None
    return (1.0 / scale).astype(np.float32)


def legalize_quantize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    data = call.args[0].ty
    out_dtype = str(call.attrs.out_dtype)
    if not isinstance(data, relax.TensorType) or data.dtype != "float32" \
            or "int" not in out_dtype or data.ndim <= 0:
        return _DEFAULT(bb, call)
    axis = int(call.attrs.axis) % data.ndim
    shape = [getattr(d, "value", None) for d in data.shape.values] \
        if hasattr(data.shape, "values") else None
    channels = shape[axis] if shape else None
    scale, zero_point = one_value(call.args[1]), one_value(call.args[2])
    if scale is not None and zero_point is not None:
        reciprocal = reciprocals(np.asarray([scale]))
        if reciprocal is None:
            return _DEFAULT(bb, call)
        return bb.call_te(_quantize_by_reciprocal, call.args[0], float(reciprocal[0]),
                          zero_point, out_dtype, axis, primfunc_name_hint="quantize")
    if not isinstance(channels, int):
        return _DEFAULT(bb, call)
    scales, zeros = (_channel_values(call.args[1], channels),
                     _channel_values(call.args[2], channels))
    reciprocal = reciprocals(scales) if scales is not None and zeros is not None else None
    if reciprocal is None:
        return _DEFAULT(bb, call)
    zero = float(zeros[0]) if np.all(zeros == zeros[0]) else relax.const(
        zeros.astype(np.float32))
    return bb.call_te(_quantize_by_reciprocal, call.args[0], relax.const(reciprocal), zero,
                      out_dtype, axis, primfunc_name_hint="quantize")


LEGALIZE_MAP = {"relax.quantize": legalize_quantize}
