"""Legalization of float32 ``x / c`` with ``c`` a constant: ``x * (1 / c)``, the reciprocal
computed once at compile time.

Why: without fast-math LLVM keeps a division by a constant (it may only use the reciprocal
where that is exact, a power of two): one ``vdivps`` per vector, which issues several times
slower than a multiply (AVX2 and AVX-512 alike). Such divisions sit in the epilogues of whole
layers: GELU's ``x / sqrt(2)`` after every transformer MLP's first matmul, hard-swish's
``/ 6`` after MobileNetV3's convs (onnxruntime multiplies by 1/6 there).

Exactness: where ``c`` is a power of two the reciprocal is exact and so is the product; else
``x * fl(1 / c)`` is within one unit in the last place of ``x / c``.

Small tensors (under MIN_ELEMENTS, a scalar such as a dynamic quantization's range / 255) keep
the division: it costs nothing there, and their values must match onnxruntime's divisions
exactly.

Where: handed to ``LegalizeOps`` as part of its customize map (passes/lowering), after every
Relax pass: the patterns that read a divide (FoldChannelAffine, the bf16 attention) still see
it. Divisors that are not constants, zeros, infinities and NaNs keep TVM's lowering."""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, tirx, topi

from ..frontends.relax_shapes import static_shape
from ..relax_walk import constant_values

_DEFAULT = tvm.ir.Op.get("relax.divide").get_attr("FLegalize")
MIN_ELEMENTS = 256


def _divide(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    x, divisor = call.args
    values = constant_values(divisor)
    shape = static_shape(call)  # None: a symbolic dim, counted as many elements
    if (str(call.ty.dtype) != "float32" or values is None or
            (shape is not None and math.prod(shape) < MIN_ELEMENTS) or
            not np.all(np.isfinite(values)) or np.any(values == 0)):
        return _DEFAULT(bb, call)
    reciprocal = (np.float32(1.0) / values.astype(np.float32)).astype(np.float32)
    if reciprocal.size == 1:  # a number of the kernel's code, not a buffer it reads
        scale = tirx.const(float(reciprocal.reshape(-1)[0]), "float32")
        return bb.call_te(lambda a: topi.multiply(a, scale), x, primfunc_name_hint="divide")
    return bb.call_te(topi.multiply, x, relax.const(reciprocal, "float32"),
                      primfunc_name_hint="divide")


LEGALIZE_MAP = {"relax.divide": _divide}
