"""Legalization of ``relax.quantize`` with one constant scale: multiply by its reciprocal
instead of dividing by it.

Why: TVM lowers ``quantize`` to ``round(x / scale)``, and without fast-math LLVM keeps the
division: one ``vdivps`` per output vector, ~10 cycles each on AVX-512 against half a cycle for
a multiply. In an int8 model every layer ends in a quantize (the next layer's input), so the
division sat in the epilogue of every kernel. MobileNetV2's int8 depthwise 3x3 over
56x56x144 had 8 divisions against 72 multiply-adds per tile and spent more time dividing
than convolving (one kernel timed alone, 2 threads: 0.091 -> 0.073 ms).

Exactness: ``x * fl(1 / scale)`` differs from ``x / scale`` by at most one unit in the last
place, so ``round`` can come out one quantization step apart where ``x / scale`` lies within
that of a half-way point: rare, and within the step-size tolerance the int8 results are held
to (onnxruntime's QuantizeLinear divides, so a pre-quantized model can differ from it there).

Where: handed to ``LegalizeOps`` as part of its customize map (passes/lowering). Per-channel
scales, zero points that are not one constant and non-float32 inputs keep TVM's lowering."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx

_DEFAULT = tvm.ir.Op.get("relax.quantize").get_attr("FLegalize")


def _one_value(expr: relax.Expr) -> float | None:
    """The value of a constant whose elements are one number (a scalar, [1], [1, 1, ...])."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    values = expr.value.numpy()
    return float(values.reshape(-1)[0]) if values.size == 1 else None


def _quantize_by_reciprocal(x: te.Tensor, reciprocal: float, zero_point: float, out_dtype):
    low, high = (float(v) for v in (tirx.min_value(out_dtype).value,
                                    tirx.max_value(out_dtype).value))

    def compute(*i):
        value = te.round(x(*i) * tirx.const(reciprocal, "float32")) + \
            tirx.const(zero_point, "float32")
        return te.max(te.min(value, tirx.const(high, "float32")),
                      tirx.const(low, "float32")).astype(out_dtype)

    return te.compute(x.shape, compute, name="quantized")


def legalize_quantize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    scale, zero_point = _one_value(call.args[1]), _one_value(call.args[2])
    data = call.args[0].ty
    out_dtype = str(call.attrs.out_dtype)
    if (scale is None or zero_point is None or not np.isfinite(scale) or scale == 0
            or not isinstance(data, relax.TensorType) or data.dtype != "float32"
            or "int" not in out_dtype):
        return _DEFAULT(bb, call)
    reciprocal = float(np.float32(1.0 / np.float64(np.float32(scale))))
    return bb.call_te(_quantize_by_reciprocal, call.args[0], reciprocal, zero_point, out_dtype,
                      primfunc_name_hint="quantize")


LEGALIZE_MAP = {"relax.quantize": legalize_quantize}
