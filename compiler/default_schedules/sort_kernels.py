"""Sort, argsort and top-k as TIR kernels, so that a compiled model needs only TVM's runtime.

Why: TOPI's CPU sort, argsort and top-k are ``te.extern`` calls of ``tvm.contrib.sort.*``,
packed functions registered by TVM's compiler library, not by ``libtvm_runtime.so``. A model
that used them ran in the process that compiled it and failed in every other one.

How: one kernel computes the sorting permutation of every row along the axis with a stable
bottom-up merge sort (rows in parallel; each merge pass writes into a swap buffer and copies
back). Ties keep their original order, as onnxruntime's TopK and numpy's stable sort do: the
lower index comes first, whether ascending or descending. Values are then gathered through the
permutation, top-k takes its first k entries. Shapes may be symbolic.

Where: ``SelfContainedKernels`` (passes/lowering) calls these through ``call_te`` before TVM's
DispatchSortScan would pick TOPI's kernels."""

from __future__ import annotations

from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

INDEX = "int64"


def _row_geometry(shape, axis: int):
    before, after = tirx.const(1, INDEX), tirx.const(1, INDEX)
    for k, dim in enumerate(shape):
        if k < axis:
            before = before * tirx.Cast(INDEX, dim)
        elif k > axis:
            after = after * tirx.Cast(INDEX, dim)
    return before, after


def _merge_sort_ir(data, order, swap, axis: int, ascending: bool):
    """TIR: ``order`` holds, per row along ``axis``, the stable sorting permutation of
    ``data``'s row (``swap`` is scratch of the same shape)."""
    before, after = _row_geometry(data.shape, axis)
    size = tirx.Cast(INDEX, data.shape[axis])
    with IRBuilder() as ib:
        data, order, swap = (T.buffer_proxy(b) for b in (data, order, swap))
        with T.parallel(0, before * after) as row:
            base = (row // after) * size * after + row % after

            def at(position):
                return base + position * after

            with T.serial(0, size) as j:
                order[at(j)] = tirx.Cast(INDEX, j)
            width = local_scalar(INDEX)
            low = local_scalar(INDEX)
            left = local_scalar(INDEX)
            right = local_scalar(INDEX)
            take_left = local_scalar("bool")
            width[0] = tirx.const(1, INDEX)
            with T.While(width[0] < size):
                low[0] = tirx.const(0, INDEX)
                with T.While(low[0] < size):
                    mid = tirx.min(low[0] + width[0], size)
                    high = tirx.min(low[0] + 2 * width[0], size)
                    left[0] = low[0]
                    right[0] = mid
                    with T.serial(0, high - low[0]) as step:
                        _choose(take_left, left[0] < mid, right[0] < high,
                                data[at(order[at(left[0])])], data[at(order[at(right[0])])],
                                ascending)
                        with T.If(take_left[0]):
                            with T.Then():
                                swap[at(low[0] + step)] = order[at(left[0])]
                                left[0] = left[0] + 1
                            with T.Else():
                                swap[at(low[0] + step)] = order[at(right[0])]
                                right[0] = right[0] + 1
                    low[0] = low[0] + 2 * width[0]
                with T.serial(0, size) as j:
                    order[at(j)] = swap[at(j)]
                width[0] = width[0] * 2
        return ib.get()


def local_scalar(dtype: str):
    """A mutable scalar of a kernel built with the IR builder (a one-element local buffer)."""
    return T.buffer_proxy(T.decl_buffer([1], dtype, scope="local"))


def _choose(flag, left_open, right_open, left_value, right_value, ascending: bool) -> None:
    """flag := the merge takes the left run's head. On equal keys the left (lower original
    index) wins; the right head is read only while the right run is not exhausted."""
    with T.If(left_open):
        with T.Then():
            with T.If(right_open):
                with T.Then():
                    if ascending:
                        flag[0] = tirx.Not(right_value < left_value)
                    else:
                        flag[0] = tirx.Not(left_value < right_value)
                with T.Else():
                    flag[0] = tirx.const(True, "bool")
        with T.Else():
            flag[0] = tirx.const(False, "bool")


def sort_order(data: te.Tensor, axis: int, ascending: bool) -> te.Tensor:
    """int64 tensor of data's shape: the stable sorting permutation along ``axis``."""
    axis = axis + len(data.shape) if axis < 0 else axis
    order, _swap = te.extern(
        [data.shape, data.shape], [data],
        lambda ins, outs: _merge_sort_ir(ins[0], outs[0], outs[1], axis, ascending),
        dtype=[INDEX, INDEX], name="aotc_merge_sort", tag="aotc_merge_sort")
    return order


def _gather(data: te.Tensor, order: te.Tensor, axis: int, name: str) -> te.Tensor:
    def value(*index):
        at = list(index)
        at[axis] = order[index]
        return data[tuple(at)]
    return te.compute(order.shape, value, name=name)


def _leading(tensor: te.Tensor, axis: int, count, name: str) -> te.Tensor:
    shape = list(tensor.shape)
    shape[axis] = count
    return te.compute(shape, lambda *index: tensor[index], name=name)


def sort(data: te.Tensor, axis: int = -1, ascending: bool = True) -> te.Tensor:
    axis = axis + len(data.shape) if axis < 0 else axis
    return _gather(data, sort_order(data, axis, ascending), axis, "aotc_sorted")


def argsort(data: te.Tensor, axis: int = -1, ascending: bool = True,
            dtype: str = "int64") -> te.Tensor:
    order = sort_order(data, axis, ascending)
    return te.compute(order.shape, lambda *i: order[i].astype(dtype), name="aotc_argsorted")


def topk(data: te.Tensor, k: int, axis: int = -1, ret_type: str = "both",
         largest: bool = True, dtype: str = "int64"):
    """TOPI's topk contract: ``ret_type`` "both" gives [values, indices]; "values" or
    "indices" gives that one tensor. k < 1 means the whole axis (as TOPI)."""
    axis = axis + len(data.shape) if axis < 0 else axis
    extent = data.shape[axis]
    if k < 1:
        count = extent
    elif isinstance(extent, tirx.IntImm):
        count = min(k, int(extent))
    else:
        count = tirx.min(tirx.const(k, extent.dtype), extent)
    order = _leading(sort_order(data, axis, not largest), axis, count, "aotc_topk_order")
    values = _gather(data, order, axis, "aotc_topk_values")
    indices = te.compute(order.shape, lambda *i: order[i].astype(dtype), name="aotc_topk_indices")
    if ret_type == "values":
        return values
    if ret_type == "indices":
        return indices
    return [values, indices]


def median(data: te.Tensor, axis, keepdims: bool):
    """torch's median (the lower of the two middle values) over one axis, with its index, or
    over every element (value only), as TVM's legalization of ``relax.median`` defines it, on
    this file's sort."""
    from tvm import topi
    if not axis:
        count = 1
        for dim in data.shape:
            count = count * dim
        flat = topi.reshape(data, [count])
        order = sort_order(flat, 0, True)
        middle = te.compute((1,), lambda _i: flat[order[(count - 1) // 2]], name="aotc_median")
        return middle if keepdims else topi.reshape(middle, [])
    axis = int(axis[0]) % len(data.shape)
    order = sort_order(data, axis, True)
    middle = (data.shape[axis] - 1) // 2
    shape = [1 if k == axis else d for k, d in enumerate(data.shape)]

    def pick(*index):
        at = list(index)
        at[axis] = middle
        return order[tuple(at)]
    index = te.compute(shape, pick, name="aotc_median_index")
    value = te.compute(shape, lambda *i: data[tuple(
        index[i] if k == axis else i[k] for k in range(len(shape)))], name="aotc_median_value")
    if not keepdims:
        value, index = topi.squeeze(value, axis=[axis]), topi.squeeze(index, axis=[axis])
    return value, index
