"""Legalization of ``relax.maximum`` / ``minimum`` / ``nn.relu`` / ``clip`` that propagates NaN.

Why: TVM legalizes them to TIR ``max``/``min``, which LLVM lowers to a compare and select that
drops a NaN operand: Relu(NaN) came out 0 and Max(NaN, 1) came out 1, where onnxruntime, torch
and numpy give NaN (so do ONNX Elu and HardSigmoid, built from these; Clip(NaN, 0, 1) gave 0 or 1). A NaN that turns into a
plausible number is a silent wrong answer. Here a float result is NaN when either operand is;
integers keep TOPI's kernels. Reductions (ReduceMax, MaxPool) are not these ops and keep theirs.

How: ``relu(x) = select(x < 0, 0, x)`` (NaN < 0 is false, so NaN passes: one compare, as
before); ``maximum(a, b) = select(isnan(b) or a < b, b, a)``, minimum likewise;
``clip(x) = select(x < lo, lo, select(hi < x, hi, x))``: all vectorize to compares and blends.

Where: handed to ``LegalizeOps`` as part of its customize map (passes/lowering)."""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx, topi


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _broadcast_index(tensor: te.Tensor, out_ndim: int, index: tuple) -> list:
    """``index`` of an output of rank ``out_ndim``, as numpy broadcasting reads ``tensor``."""
    offset = out_ndim - len(tensor.shape)
    picked = []
    for k, dim in enumerate(tensor.shape):
        unit = isinstance(dim, tirx.IntImm) and int(dim) == 1
        picked.append(tirx.const(0, index[offset + k].ty) if unit else index[offset + k])
    return picked


def _pick(kind: str):
    def combine(a, b):
        if kind == "max":
            return tirx.Select(tirx.Or(tirx.isnan(b), a < b), b, a)
        return tirx.Select(tirx.Or(tirx.isnan(b), b < a), b, a)
    return combine


def _binary(kind: str, default):
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        a, b = call.args
        if not _is_float(str(call.ty.dtype)) or not all(
                isinstance(arg.ty, relax.TensorType) for arg in (a, b)):
            return bb.call_te(default, a, b)
        combine = _pick(kind)

        def compute(x: te.Tensor, y: te.Tensor) -> te.Tensor:
            shape = default(x, y).shape  # numpy broadcasting of the two shapes, as TOPI does it
            ndim = len(shape)
            return te.compute(shape, lambda *i: combine(x(*_broadcast_index(x, ndim, i)),
                                                        y(*_broadcast_index(y, ndim, i))),
                              name=f"T_nan_{kind}imum", tag="broadcast")
        return bb.call_te(compute, a, b, primfunc_name_hint=f"{kind}imum")
    return legalize


def _relu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    x = call.args[0]
    dtype = str(call.ty.dtype)
    if not _is_float(dtype):
        return bb.call_te(topi.nn.relu, x)

    def compute(t: te.Tensor) -> te.Tensor:
        zero = tirx.const(0, dtype)
        return te.compute(t.shape, lambda *i: tirx.Select(t(*i) < zero, zero, t(*i)),
                          name="T_relu", tag="elemwise")
    return bb.call_te(compute, x, primfunc_name_hint="relu")


def _nan_clip(x: te.Tensor, low, high) -> te.Tensor:
    """topi.clip's bounds (PrimExprs or numbers), compared so that NaN passes through."""
    dtype = x.dtype

    def bound(value):
        return tirx.Cast(dtype, value) if tvm.ir.is_prim_expr(value) else tirx.const(value, dtype)

    def compute(*i):
        value = x(*i)
        lo, hi = bound(low), bound(high)
        return tirx.Select(value < lo, lo, tirx.Select(hi < value, hi, value))
    return te.compute(x.shape, compute, name="compute", tag="elemwise")


def _clip(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    x, low, high = call.args
    if not _is_float(str(call.ty.dtype)):
        return bb.call_te(topi.clip, x, low, high, primfunc_name_hint="tir_clip")
    return bb.call_te(_nan_clip, x, low, high, primfunc_name_hint="tir_clip")


LEGALIZE_MAP = {"relax.maximum": _binary("max", topi.maximum),
                "relax.minimum": _binary("min", topi.minimum),
                "relax.nn.relu": _relu,
                "relax.clip": _clip}
