"""Reductions whose axes arrive as a run-time tensor (ReduceSum-13, the other Reduce*-18).

Why: TVM 0.27's converters require constant axes ("Only constant axes currently supported");
onnxruntime takes them at run time, and the ONNX node suite passes them as graph inputs (126
cases). The output shape then depends on the axes' values, so it is computed at run time too.

How (Relax, static rank, data shape known): which dims are reduced is a run-time mask. For
every dim d, the partial result is replaced by its reduction over d, broadcast back, where the
mask says so; then the leading corner (1 along reduced dims) is sliced out with a run-time end
(``dynamic_strided_slice``) and given a shape of fresh symbolic dims. ``keepdims=0`` reshapes
to the kept dims, found by a stable sort of the mask. The axes go through ``take`` on
``arange(rank)``, so GuardIndices normalizes negative axes and stops the run with a named error
on an out-of-range one. Cost: one reduction per dim over the full tensor; models from real
exporters carry constant axes, which TVM's own converters handle.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from aotc.errors import UnsupportedModelError

from .relax_shapes import checked_axes, fresh_shape, i64, static_shape

# ONNX op -> (value transform before, core reduction, transform after)
_SQUARE = "square"
REDUCTIONS = {
    "ReduceSum": (None, "sum", None),
    "ReduceMean": (None, "sum", "mean"),
    "ReduceMax": (None, "max", None),
    "ReduceMin": (None, "min", None),
    "ReduceProd": (None, "prod", None),
    "ReduceL1": ("abs", "sum", None),
    "ReduceL2": (_SQUARE, "sum", "sqrt"),
    "ReduceSumSquare": (_SQUARE, "sum", None),
    "ReduceLogSum": (None, "sum", "log"),
    "ReduceLogSumExp": ("logsumexp", "sum", "log"),
}
_CORE = {"sum": R.sum, "max": R.max, "min": R.min, "prod": R.prod}


def convert_reduction(op_name: str, bb: relax.BlockBuilder, inputs: list, attrs: dict,
                      _opset: int = 0, _params=None):
    """The reduction with run-time axes, or None when TVM's converter can take the node
    (no axes input, constant axes, or a data shape not known at compile time)."""
    if len(inputs) < 2 or inputs[1] is None or isinstance(inputs[1], tvm.ir.GenericConst):
        return None
    data, axes = inputs[0], inputs[1]
    shape, axes_shape = static_shape(data), static_shape(axes)
    if shape is None or axes_shape is None:
        return None
    if 0 in shape:
        raise UnsupportedModelError(
            f"{op_name} over run-time axes of an empty tensor (shape {shape}): a reduced "
            "empty dim becomes 1 and a kept one stays 0, which this converter cannot tell "
            "apart at compile time; not supported")
    rank, count = len(shape), axes_shape[0]
    keepdims = attrs.get("keepdims", 1)
    if count == 0 and attrs.get("noop_with_empty_axes", 0):
        return data
    mask = bb.emit(_mask(bb, axes, rank, count))
    before, core, after = REDUCTIONS[op_name]
    x = data
    if before == "abs":
        x = bb.emit(R.abs(x))
    elif before == _SQUARE:
        x = bb.emit(R.multiply(x, x))
    elif before == "logsumexp":  # shift by the max for stability: log(sum(e^(x-m))) + m
        peak = _reduce_full(bb, data, mask, shape, "max")
        x = bb.emit(R.exp(R.subtract(data, peak)))
    y = _reduce_full(bb, x, mask, shape, core)
    if after == "mean":
        sizes = R.where(mask, i64(shape), i64(np.ones(rank)))
        y = bb.emit(R.divide(y, R.astype(R.prod(sizes), str(data.ty.dtype))))
    elif after in ("sqrt", "log"):
        y = bb.emit(getattr(R, after)(y))
    if before == "logsumexp":
        y = bb.emit(R.add(y, peak))
    return _corner(bb, y, mask, shape, keepdims, rank - count)


def _mask(bb, axes, rank: int, count: int) -> relax.Expr:
    """bool[rank]: True on reduced dims. No axes (count 0) reduces every dim."""
    if count == 0:
        return relax.const(np.ones(rank, bool), "bool")
    dims = checked_axes(bb, axes, rank)
    hits = R.equal(R.reshape(dims, [count, 1]), i64(np.arange(rank)[None, :]))
    return R.greater(R.sum(R.astype(hits, "int64"), axis=[0]), i64(0))


def _reduce_full(bb, x, mask, shape: list[int], core: str) -> relax.Expr:
    """x reduced over the masked dims, broadcast back to x's full shape."""
    for d, size in enumerate(shape):
        if size == 1:
            continue
        reduced = R.broadcast_to(_CORE[core](x, axis=[d], keepdims=True), shape)
        on = R.strided_slice(mask, axes=[0], begin=[d], end=[d + 1])
        x = bb.emit(R.where(on, reduced, x))
    return x


def _corner(bb, y, mask, shape: list[int], keepdims: int, kept: int) -> relax.Expr:
    rank = len(shape)
    end = bb.emit(R.where(mask, i64(np.ones(rank)), i64(shape)))
    sliced = bb.emit(R.dynamic_strided_slice(y, i64(np.zeros(rank)), end, i64(np.ones(rank))))
    dims = fresh_shape(bb, end, rank, "reduced")
    out = bb.match_cast(sliced, relax.TensorType(dims, str(y.ty.dtype)))
    if keepdims:
        return out
    # kept dims in order: sort by (reduced, position), take the first `kept` sizes
    order = R.argsort(R.add(R.multiply(R.astype(mask, "int64"), i64(rank)),
                            i64(np.arange(rank))), axis=0, dtype="int64")
    kept_sizes = bb.emit(R.strided_slice(R.take(i64(shape), order, axis=0),
                                         axes=[0], begin=[0], end=[kept]))
    return R.reshape(out, fresh_shape(bb, kept_sizes, kept, "kept"))
