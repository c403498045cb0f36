"""Legalization of ``relax.maximum`` / ``minimum`` / ``nn.relu`` / ``clip`` that propagates NaN.

Why: TVM legalizes them to TIR ``max``/``min``, which LLVM lowers to a compare and select that
drops a NaN operand: Relu(NaN) came out 0 and Max(NaN, 1) came out 1, where onnxruntime, torch
and numpy give NaN (so do ONNX Elu and HardSigmoid, built from these; Clip(NaN, 0, 1) gave 0 or 1).
A NaN that turns into a
plausible number is a silent wrong answer. Here a float result is NaN when either operand is;
integers keep TOPI's kernels. Reductions (ReduceMax, MaxPool) are not these ops and keep theirs.

How: ``relu(x) = select(x < 0, 0, x)`` (NaN < 0 is false, so NaN passes: one compare, as
before); ``maximum(a, b) = select(a < b, b, select(b <= a, a, a + b))`` (both compares
fail only for NaN, and a + b is then NaN), minimum likewise;
``clip(x) = select(x < lo, lo, select(hi < x, hi, x))``: all vectorize to compares and blends.

Where: handed to ``LegalizeOps`` as part of its customize map (passes/lowering)."""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx, topi
from tvm.relax.transform.legalize_ops.common import _try_convert_to_scalar_const


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _broadcast_index(tensor: te.Tensor, shape, index: tuple) -> list:
    """``index`` of an output of ``shape``, as numpy broadcasting reads ``tensor``: 0 on a unit
    dimension the output extends (the same index elsewhere, so that an operand of the output's
    shape reads as elementwise and fuses as such)."""
    offset = len(shape) - len(tensor.shape)
    picked = []
    for k, dim in enumerate(tensor.shape):
        out = shape[offset + k]
        extended = _is_one(dim) and not _is_one(out)
        picked.append(tirx.const(0, index[offset + k].ty) if extended else index[offset + k])
    return picked


def _is_one(dim) -> bool:
    return isinstance(dim, tirx.IntImm) and int(dim) == 1


def nan_max(a, b):
    """max(a, b), NaN if either is: a compare-only form (a call such as isnan makes
    AnnotateTIROpPattern call the kernel opaque, and FuseOps then left ReLU6 out of the conv)."""
    return tirx.Select(a < b, b, tirx.Select(b <= a, a, a + b))


def nan_min(a, b):
    return tirx.Select(b < a, b, tirx.Select(a <= b, a, a + b))


def _pick(kind: str):
    return nan_max if kind == "max" else nan_min


def _binary(kind: str, default):
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        dtype = str(call.ty.dtype)
        # a scalar constant operand becomes a TIR constant, as TVM's own legalization does:
        # with a 0-d tensor operand the kernel is "broadcast", and FuseOps left it out of the
        # convolution before it (ReLU6 as maximum/minimum ran as two extra kernels)
        a = _try_convert_to_scalar_const(call.args[0])
        b = _try_convert_to_scalar_const(call.args[1])
        if not _is_float(dtype) or not any(isinstance(v, relax.Expr) for v in (a, b)):
            return bb.call_te(default, a, b)
        combine = _pick(kind)

        def compute(x, y) -> te.Tensor:
            shape = default(x, y).shape  # numpy broadcasting of the two shapes, as TOPI does it
            return te.compute(shape, lambda *i: combine(_read(x, shape, i, dtype),
                                                        _read(y, shape, i, dtype)),
                              name=f"T_nan_{kind}imum", tag="elemwise")
        return bb.call_te(compute, a, b, primfunc_name_hint=f"{kind}imum")
    return legalize


def _read(operand, shape, index: tuple, dtype: str):
    if isinstance(operand, te.Tensor):
        return operand(*_broadcast_index(operand, shape, index))
    return operand if tvm.ir.is_prim_expr(operand) else tirx.const(operand, dtype)


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
