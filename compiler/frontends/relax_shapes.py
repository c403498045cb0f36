"""Small Relax helpers shared by aotc's own converters for run-time-valued arguments."""

from __future__ import annotations

import numpy as np
from tvm import relax, tirx
from tvm.relax import op as R

from ..tvmscript import parsed


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The tensor's shape when every dim is known at compile time, else None."""
    return static_values(getattr(expr.ty, "shape", None))


def static_values(shape) -> list[int] | None:
    """The dims of a shape expression (``R.shape([...])``) when all are constants, else None."""
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(d, tirx.IntImm) for d in values):
        return None
    return [int(d) for d in values]


def i64(values) -> relax.Expr:
    """An int64 constant (relax.const alone turns int64 numpy arrays into int32)."""
    return relax.const(np.asarray(values, np.int64), "int64")


def fresh_shape(bb: relax.BlockBuilder, dims_tensor: relax.Expr, n: int, hint: str) -> list:
    """Symbolic dims bound to the values of int64[n] ``dims_tensor`` at run time."""
    dims = [tirx.Var(f"{hint}{k}", "int64") for k in range(n)]
    bb.match_cast(bb.emit(R.tensor_to_shape(dims_tensor)), relax.ShapeType(dims))
    return dims


def checked_axes(bb: relax.BlockBuilder, axes: relax.Expr, rank: int) -> relax.Expr:
    """int64[n]: run-time axes (any int type, any shape) with negative ones normalized; one out
    of range stops the run, as ``take`` on ``arange(rank)`` goes through GuardIndices."""
    count = int(np.prod(static_shape(axes) or [1]))
    flat = R.reshape(bb.emit(R.astype(axes, "int64")), [count])
    return bb.emit(R.take(i64(np.arange(rank)), flat, axis=0))


def checked_dims(bb: relax.BlockBuilder, dims: relax.Expr, n: int, message: str,
                 aggregate: relax.Expr | None = None, expected: int = 0) -> relax.Expr:
    """``dims`` (int64[n]) passed through a kernel that stops the run with ``ValueError:
    message`` unless every dim is >= 0 and ``aggregate`` (an int64 scalar computed from them,
    e.g. their product; none: only the sign is checked) equals ``expected``. The shape a
    run-time Reshape or Split produces is only safe to use after this: TVM trusts it and
    would read past the data."""
    kernel = parsed(_CHECK_SOURCE.format(n=n, expected=expected,
                                                         message=repr(message)))
    gv = bb.add_func(kernel, "aotc_check_dims")
    total = i64([expected]) if aggregate is None else bb.emit(R.reshape(aggregate, [1]))
    return bb.emit(relax.call_tir(gv, [dims, total], relax.TensorType((n,), "int64")))


# opaque (op_pattern 8): never fused into a consumer, so the assert runs first
_CHECK_SOURCE = """
@T.prim_func(private=True, s_tir=True)
def check_dims(dims: T.Buffer(({n},), "int64"), total: T.Buffer((1,), "int64"),
               out: T.Buffer(({n},), "int64")):
    T.func_attr({{"op_pattern": 8, "tirx.is_scheduled": True, "tirx.noalias": True}})
    for i in range({n}):
        with T.sblock("check"):
            T.reads(dims[i], total[0])
            T.writes(out[i])
            assert total[0] == T.int64({expected}) and dims[i] >= T.int64(0), \\
                ("ValueError", [{message}])
            out[i] = dims[i]
"""
