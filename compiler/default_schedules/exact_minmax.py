"""Legalization of ``relax.max`` / ``relax.min`` with infinite identities.

Why: TVM 0.27 legalizes max/min reductions with the largest *finite* value as the identity, so
the max of a row of -inf came out as -3.4e38 (and the min of +inf as 3.4e38): a silent wrong
answer wherever masks use infinities. The ONNX node suite's expanded Attention tests it
(``RowAllMasked = Equal(ReduceMax(bias), -inf)`` never fired: NaN rows instead of zeros).
Here the identity is -inf / +inf for floats (integers keep their type's limits, which are exact),
and a NaN anywhere in a float reduction makes the result NaN (TIR max/min dropped it).

Where: handed to ``LegalizeOps`` as its customize map (compiler/pipeline.py)."""

from __future__ import annotations

import math

from tvm import relax, te, tirx

from .nan_minmax import nan_max, nan_min


def _identity(kind: str, dtype: str):
    if dtype.startswith(("float", "bfloat")):
        return tirx.const(-math.inf if kind == "max" else math.inf, dtype)
    return tirx.min_value(dtype) if kind == "max" else tirx.max_value(dtype)


def _combine(kind: str, dtype: str):
    """max/min, NaN if either side is NaN for floats (as numpy, torch and onnxruntime: ONNX
    Max/Min of several inputs is imported as this reduction over a stack)."""
    plain = tirx.max if kind == "max" else tirx.min
    if not dtype.startswith(("float", "bfloat")):
        return lambda acc, x: plain(acc, x)  # comm_reducer wants exactly two arguments

    return nan_max if kind == "max" else nan_min


def _reducer(kind: str, dtype: str):
    return te.comm_reducer(_combine(kind, dtype), lambda t: _identity(kind, t),
                           name=f"exact_{kind}")


def _reduce(kind: str, x: te.Tensor, axes: list[int], keepdims: bool) -> te.Tensor:
    ndim = len(x.shape)
    axes = sorted({a % ndim for a in axes}) if axes else list(range(ndim))
    raxes = {a: te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes}
    kept = [a for a in range(ndim) if a not in raxes]
    out_shape = [1 if a in raxes else x.shape[a] for a in range(ndim)] if keepdims else \
        [x.shape[a] for a in kept]
    reducer = _reducer(kind, str(x.dtype))

    def body(*idx):
        it = iter(idx)
        index = []
        for a in range(ndim):
            if a in raxes:
                if keepdims:
                    next(it)
                index.append(raxes[a])
            else:
                index.append(next(it))
        return reducer(x[tuple(index)], axis=list(raxes.values()))

    return te.compute(out_shape, body, name=f"exact_{kind}")


def _legalize(kind: str):
    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        axes = [int(a) for a in call.attrs.axis] if call.attrs.axis is not None else []
        return bb.call_te(_reduce, kind, call.args[0], axes, bool(call.attrs.keepdims),
                          primfunc_name_hint=kind)
    return legalize


LEGALIZE_MAP = {"relax.max": _legalize("max"), "relax.min": _legalize("min")}
