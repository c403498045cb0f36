"""CumSum, Split, TopK, Reshape, Resize, OneHot and Pad whose axis / split sizes / k / shape /
sizes or scales / depth / pads arrive as run-time tensors, and CumProd. TVM 0.27's converters
refuse them ("CumSum with non-constant axis", "Dynamic Split", "TopK k must be a constant",
"Reshape requires the input new shape to be Shape", "Dynamic pads are not supported yet"...)
or have none (CumProd).

How: where the output shape does not depend on the value (CumSum), TVM's own converter runs
once per possible constant and the run-time value selects the result. Where it does, the
result is cut with ``dynamic_strided_slice`` (which clamps into the data, so a bad value cannot
read outside it) and given fresh symbolic dims bound at run time. Axes go through ``take`` on
``arange(rank)``, which GuardIndices range-checks. Each converter returns None to leave the node
to TVM (constant arguments, or data shapes not known at compile time).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R
from tvm.relax.frontend.onnx import onnx_frontend as tvm_onnx

from .relax_shapes import checked_axes, checked_dims, fresh_shape, i64, static_shape


def _runtime(expr) -> bool:
    return expr is not None and not isinstance(expr, (tvm.ir.GenericConst, relax.ShapeExpr))


def _per_axis(bb, data, axis, along) -> relax.Expr | None:
    """``along(d)`` for the axis ``axis`` holds: directly when it is a constant, else computed
    for every d and selected by the run-time value."""
    shape = static_shape(data)
    if shape is None:
        return None
    rank = len(shape)
    if not _runtime(axis):
        return along(int(axis.value.numpy().reshape(-1)[0]) % rank)
    chosen = checked_axes(bb, axis, rank)
    result = None
    for d in range(rank):
        along_d = bb.normalize(along(d))
        result = along_d if result is None else bb.emit(
            R.where(R.equal(chosen, i64([d])), along_d, result))
    return result


def cumsum(bb, inputs, attrs, opset, params):
    """CumSum with a run-time axis (TVM's converter takes constant ones)."""
    if not _runtime(inputs[1]):
        return None
    convert = tvm_onnx.CumSum.get_converter(opset)
    return _per_axis(bb, inputs[0], inputs[1], lambda d: convert(
        bb, [inputs[0], relax.const(d, "int64")], attrs, params))


def cumprod(bb, inputs, attrs, opset, params):
    """CumProd (no TVM converter), constant or run-time axis, exclusive and reverse."""
    data = inputs[0]
    reverse, exclusive = bool(attrs.get("reverse", 0)), bool(attrs.get("exclusive", 0))

    def along(d):
        x = bb.emit(R.flip(data, d)) if reverse else data
        y = bb.emit(R.cumprod(x, axis=d, exclusive=exclusive))
        return R.flip(y, d) if reverse else y
    return _per_axis(bb, data, inputs[1], along)


def _slice_along(bb, data, shape: list[int], axis: int, begin, end, hint: str):
    """data[..., begin:end, ...] on ``axis`` (int64[1] run-time bounds), dims bound fresh."""
    rank = len(shape)
    one_hot = np.arange(rank) == axis
    begins = bb.emit(R.where(relax.const(one_hot, "bool"), begin, i64(np.zeros(rank))))
    ends = bb.emit(R.where(relax.const(one_hot, "bool"), end, i64(shape)))
    cut = bb.emit(R.dynamic_strided_slice(data, begins, ends, i64(np.ones(rank))))
    size = bb.emit(R.maximum(R.subtract(R.minimum(ends, i64(shape)), begins), i64(0)))
    dims = fresh_shape(bb, size, rank, hint)
    dims = [dims[d] if d == axis else shape[d] for d in range(rank)]
    return bb.match_cast(cut, relax.TensorType(dims, str(data.ty.dtype)))


def split(bb, inputs, attrs, opset, params):
    if len(inputs) < 2 or not _runtime(inputs[1]):
        return None
    data, sizes = inputs[0], inputs[1]
    shape, sizes_shape = static_shape(data), static_shape(sizes)
    if shape is None or sizes_shape is None or len(sizes_shape) != 1:
        return None
    axis = attrs.get("axis", 0) % len(shape)
    sizes = checked_dims(bb, bb.emit(R.astype(sizes, "int64")), sizes_shape[0],
                         f"Split: the run-time split sizes must be >= 0 and add up to "
                         f"dimension {axis} ({shape[axis]})",
                         R.sum(R.astype(sizes, "int64")), shape[axis])
    ends = bb.emit(R.cumsum(sizes, axis=0))
    outputs = []
    for k in range(sizes_shape[0]):
        end = bb.emit(R.strided_slice(ends, axes=[0], begin=[k], end=[k + 1]))
        size = bb.emit(R.strided_slice(sizes, axes=[0], begin=[k], end=[k + 1]))
        outputs.append(_slice_along(bb, data, shape, axis, bb.emit(R.subtract(end, size)), end,
                                    f"split{k}_"))
    return relax.Tuple(outputs)


def top_k(bb, inputs, attrs, opset, params):
    data, k = inputs[0], inputs[1] if len(inputs) > 1 else None
    shape = static_shape(data)
    if not _runtime(k) or shape is None or opset < 10:
        return None
    axis = attrs.get("axis", -1) % len(shape)
    everything = relax.const(np.array([shape[axis]], np.int64), "int64")
    full = bb.normalize(tvm_onnx.TopK.get_converter(opset)(bb, [data, everything], attrs, params))
    end = bb.emit(R.reshape(R.astype(k, "int64"), [1]))
    zero = i64([0])
    return relax.Tuple([
        _slice_along(bb, bb.emit(relax.TupleGetItem(full, i)), shape, axis, zero, end, f"k{i}_")
        for i in range(2)])


def reshape(bb, inputs, attrs, opset, params):
    data, target = inputs[0], inputs[1] if len(inputs) > 1 else None
    shape, target_shape = static_shape(data), static_shape(target) if target is not None \
        else None
    if not _runtime(target) or shape is None or target_shape is None:
        return None
    n = target_shape[0]
    wanted = bb.emit(R.astype(target, "int64"))
    if not attrs.get("allowzero", 0):  # 0 copies the input's dim at that position
        copied = i64([shape[i] if i < len(shape) else 0 for i in range(n)])
        wanted = bb.emit(R.where(R.equal(wanted, i64(0)), copied, wanted))
    total = int(np.prod(shape))
    known = R.prod(R.where(R.equal(wanted, i64(-1)), i64(np.ones(n)), wanted))
    inferred = R.floor_divide(i64(total), known)
    final = bb.emit(R.where(R.equal(wanted, i64(-1)), inferred, wanted))
    final = checked_dims(bb, final, n,
                         f"Reshape: the run-time shape does not hold the data's {total} "
                         f"elements (data shape {shape})", R.prod(final), total)
    return R.reshape(data, fresh_shape(bb, final, n, "reshaped"))


def resize(bb, inputs, attrs, opset, params):
    """Resize (2-D/3-D, constant or no roi) with run-time sizes or scales: TVM's converter
    builds the call with placeholder sizes, then the output size becomes run-time dims.
    Scales must give whole output sizes (TVM's kernels map coordinates by the size ratio;
    ONNX by the scale, which differ otherwise), and nearest resizing needs whole ratios
    (_whole_ratio): any other value is a named run-time error."""
    data = inputs[0]
    scales = inputs[2] if len(inputs) > 2 else None
    sizes = inputs[3] if len(inputs) > 3 else None
    roi = inputs[1] if len(inputs) > 1 else None
    shape = static_shape(data)
    if shape is None or len(shape) not in (4, 5) or _runtime(roi) or not (
            _runtime(scales) or _runtime(sizes)) or opset < 13:
        return None
    rank = len(shape)
    placeholder = relax.const(np.asarray(shape, np.int64), "int64")
    template = tvm_onnx.Resize.get_converter(opset)(
        bb, [data, roi, None, placeholder], attrs, params)
    if not isinstance(template, relax.Call) or template.op.name not in (
            "relax.image.resize2d", "relax.image.resize3d"):
        return None
    if _runtime(sizes):
        wanted = bb.emit(R.astype(sizes, "int64"))
        wanted = checked_dims(bb, wanted, rank, "Resize: run-time sizes must be >= 0")
    else:
        exact = bb.emit(R.multiply(R.astype(i64(shape), "float32"), R.astype(scales, "float32")))
        wanted = bb.emit(R.astype(R.floor(exact), "int64"))
        inexact = R.sum(R.astype(R.not_equal(R.floor(exact), exact), "int64"))
        wanted = checked_dims(bb, wanted, rank,
                              "Resize: run-time scales must give whole output sizes "
                              f"(input shape {shape}); fractional ones are not supported",
                              inexact)
    if attrs.get("mode", b"nearest") == b"nearest":
        wanted = _whole_ratio(bb, wanted, shape)
    dims = fresh_shape(bb, wanted, rank, "resized")
    args = [template.args[0], relax.ShapeExpr(dims[2:]), *template.args[2:]]
    return relax.Call(template.op, args, template.attrs, template.ty_args)


def _whole_ratio(bb, wanted, shape: list[int]) -> relax.Expr:
    """Nearest resizing only where each output size is a multiple or a divisor of the input
    size. TVM maps output to input coordinates by multiplying with in/out in float32; at a
    ratio such as 2/7 a coordinate that is exactly halfway (0.5) comes out 0.5000001 and
    picks the other pixel (onnx divides by the scale and gets the tie right). Whole ratios
    have no such ties."""
    size = i64(shape)
    out = R.maximum(wanted, i64(1))
    divides = R.logical_or(R.equal(R.floor_mod(out, size), i64(0)),
                           R.equal(R.floor_mod(size, out), i64(0)))
    bad = R.sum(R.astype(R.logical_not(divides), "int64"))
    return checked_dims(bb, wanted, len(shape),
                        "Resize (nearest): each run-time output size must be a multiple or a "
                        f"divisor of the input size {shape}; other ratios are not supported",
                        bad)


def one_hot(bb, inputs, attrs, opset, params):
    """OneHot with a run-time depth: compare the (normalized) indices with arange(depth)."""
    indices, depth, values = inputs[0], inputs[1], inputs[2]
    shape = static_shape(indices)
    if not _runtime(depth) or shape is None:
        return None
    rank = len(shape) + 1
    axis = attrs.get("axis", -1) % rank
    count = bb.emit(R.reshape(R.astype(depth, "int64"), [1]))
    count = checked_dims(bb, count, 1, "OneHot: the run-time depth must be >= 1",
                         R.sum(R.astype(R.less(count, i64(1)), "int64")))
    (d,) = fresh_shape(bb, count, 1, "depth")
    positions = R.arange(0, d, 1, "int64")
    along_axis = R.reshape(positions, [d if k == axis else 1 for k in range(rank)])
    index = R.astype(indices, "int64")
    index = R.where(R.less(index, i64(0)), R.add(index, count), index)
    hits = R.equal(R.expand_dims(index, axis), along_axis)
    off = R.strided_slice(values, axes=[0], begin=[0], end=[1])
    on = R.strided_slice(values, axes=[0], begin=[1], end=[2])
    return R.where(hits, on, off)


def pad(bb, inputs, attrs, opset, params):
    """Pad with run-time pads (any mode): each output axis gathers from the input at
    position i - pad_begin, mapped by the mode (constant: masked where outside, edge: clamped,
    reflect: mirrored, wrap: modulo). Negative pads crop the same way."""
    data, pads = inputs[0], inputs[1] if len(inputs) > 1 else None
    shape = static_shape(data)
    if opset < 11 or not _runtime(pads) or shape is None:
        return None
    axes_input = inputs[3] if len(inputs) > 3 else None
    if _runtime(axes_input):
        return None
    rank = len(shape)
    axes = ([int(a) % rank for a in axes_input.value.numpy()] if axes_input is not None
            else list(range(rank)))
    n = len(axes)
    pads = bb.emit(R.astype(pads, "int64"))
    begin, end = _full_pads(bb, pads, axes, n, rank)
    out_sizes = bb.emit(R.add(R.add(i64(shape), begin), end))
    out_sizes = checked_dims(bb, out_sizes, rank,
                             "Pad: run-time pads remove more than the data holds")
    dims = fresh_shape(bb, out_sizes, rank, "padded")
    mode = attrs.get("mode", b"constant").decode()
    x, inside = data, None
    for a in range(rank):
        start = R.strided_slice(begin, axes=[0], begin=[a], end=[a + 1])
        pos = bb.emit(R.subtract(R.arange(0, dims[a], 1, "int64"), start))
        size = i64(shape[a])
        if mode == "constant":
            ok = R.logical_and(R.greater_equal(pos, i64(0)), R.less(pos, size))
            axis_shape = [dims[a] if k == a else 1 for k in range(rank)]
            ok = R.reshape(ok, axis_shape)
            inside = ok if inside is None else R.logical_and(inside, ok)
            src = R.clip(pos, 0, max(shape[a] - 1, 0))
        elif mode == "edge":
            src = R.clip(pos, 0, max(shape[a] - 1, 0))
        elif mode == "reflect":
            period = i64(max(2 * (shape[a] - 1), 1))
            folded = R.floor_mod(pos, period)
            src = R.where(R.greater_equal(folded, size), R.subtract(period, folded), folded)
        elif mode == "wrap":
            src = R.floor_mod(pos, size)
        else:
            return None
        x = bb.emit(R.take(x, src, axis=a))
    if mode != "constant":
        return x
    value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else relax.const(
        0, str(data.ty.dtype))
    return R.where(inside, x, R.astype(value, str(data.ty.dtype)))


def _full_pads(bb, pads, axes: list[int], n: int, rank: int):
    """(begin, end) int64[rank] from ONNX pads [begins of ``axes``..., ends of ``axes``...]."""
    slot = np.zeros(rank, np.int64)
    listed = np.zeros(rank, bool)
    for i, a in enumerate(axes):
        slot[a], listed[a] = i, True
    halves = []
    for offset in (0, n):
        part = R.take(pads, i64(slot + offset), axis=0)
        halves.append(bb.emit(R.where(relax.const(listed, "bool"), part, i64(np.zeros(rank)))))
    return halves


CONVERTERS = {"CumSum": cumsum, "CumProd": cumprod, "Split": split, "TopK": top_k,
              "Reshape": reshape, "Resize": resize, "OneHot": one_hot, "Pad": pad}
