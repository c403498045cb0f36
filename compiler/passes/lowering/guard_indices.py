"""GuardIndices: every index tensor that reaches a gather or scatter is normalized (negative
indices count from the end, as ONNX and torch define them) and range-checked, so that no
kernel reads or writes outside its data.

Why: TVM lowers ``take`` / ``gather_*`` / ``scatter_*`` / ``index_tensor`` / ``index_put``
without bounds checks ("fast" mode). Measured on plain TVM 0.27: torch's ``x[:, -1]`` became
``take(x, -1)`` and read the element before the tensor (garbage, max diff 1.9e11); a token id of
1000 on a 4-row embedding returned a heap value, 1e8 crashed the process. onnxruntime and torch
raise instead.

How: constant indices are normalized and checked at compile time (an out-of-range constant is
a CompileError naming the op). Other indices go through one small serial kernel that writes the
normalized indices and stops the run with ``IndexError`` on the first out-of-range one; the op
then reads only those. The kernel is opaque (never fused) and costs one pass over the indices.

Where: after the layout phase (ConvertLayout would wrap the kernel's data argument in
transposes), before ``LegalizeOps``. Assumes static ranks (true for every Relax tensor here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, tirx

from aotc.errors import CompileError

from ...relax_walk import mutate_functions
from ...tvmscript import parsed

# kOpaque in TVM's OpPatternKind: FuseOps leaves the kernel alone, so its serial loop and its
# assert never end up inside a parallel, vectorized consumer.
_OPAQUE = 8


@dataclass(frozen=True)
class IndexUse:
    """Which argument of an op holds indices, and which data dimension bounds them.

    ``axis`` bounds every index by ``data.shape[axis]``; ``nd_batch`` (gather_nd / scatter_nd)
    bounds position j of the indices' last axis by ``data.shape[nd_batch + j]``."""
    arg: int
    axis: int | None = None
    nd_batch: int | None = None
    tuple_field: int | None = None  # index_tensor / index_put: field k indexes dim k


def _index_uses(call: relax.Call) -> list[IndexUse]:
    name = call.op.name
    if name in ("relax.take", "relax.gather_elements", "relax.scatter_elements"):
        axis = call.attrs.axis
        return [IndexUse(1, axis=0 if axis is None else int(axis))]
    if name == "relax.gather_nd":
        return [IndexUse(1, nd_batch=int(call.attrs.batch_dims))]
    if name == "relax.scatter_nd":
        return [IndexUse(1, nd_batch=0)]
    if name in ("relax.index_tensor", "relax.index_put"):
        fields = call.args[1].ty.fields
        return [IndexUse(1, axis=k, tuple_field=k) for k in range(len(fields))]
    return []


def _short_op(call: relax.Call) -> str:
    return call.op.name[len("relax."):]


def _static_dims(data: relax.Expr) -> list[int | None]:
    shape = data.ty.shape
    return [int(d) if isinstance(d, tirx.IntImm) else None for d in shape.values]


def _normalize_constant(values: np.ndarray, use: IndexUse, dims: list, op: str) -> np.ndarray:
    """The compile-time form of the guard kernel, for constant indices."""
    if use.nd_batch is not None:
        bound = np.array(dims[use.nd_batch:use.nd_batch + values.shape[-1]], dtype=object)
    else:
        bound = dims[use.axis if use.axis >= 0 else use.axis + len(dims)]
    if bound is None or (isinstance(bound, np.ndarray) and any(b is None for b in bound)):
        return None  # symbolic extent: checked at run time
    bound = np.asarray(bound, dtype=values.dtype)
    fixed = np.where(values < 0, values + bound, values)
    bad = (fixed < 0) | (fixed >= bound)
    if bad.any():
        raise CompileError(f"{op}: constant index {values[bad].flat[0]} is out of range for a "
                           f"dimension of size {np.broadcast_to(bound, values.shape)[bad][0]}")
    return fixed.astype(values.dtype)


def guard_kernel(index_type, data_ndim: int, data_dtype: str, use: IndexUse,
                 op: str) -> tirx.PrimFunc:
    """A serial PrimFunc(indices, data, out): out = normalized indices; IndexError if any is
    outside [-n, n). Every extent is symbolic, read from the buffers at run time, so one kernel
    serves every shape of a given rank and dtype. Written as TVMScript: the direct tirx
    constructors of TVM 0.27 have no buffer_map and a mis-ordered AssertStmt wrapper."""
    dtype, ndim = str(index_type.dtype), index_type.ndim
    idx_dims = [f"n{k}" for k in range(ndim)]
    data_dims = [f"d{k}" for k in range(data_ndim)]
    loop = [f"i{k}" for k in range(ndim)]
    at = f"[{', '.join(loop)}]" if loop else "[()]"
    bound = f'T.Cast("{dtype}", {_bound_source(use, data_dims, loop)})'
    where = (f"dimension {use.axis}" if use.nd_batch is None
             else f"the dimensions from {use.nd_batch} on")
    message = f"{op}: an index is out of range for {where} of the data (valid: -size <= i < size)"
    fixed = f"T.Select(indices{at} < 0, indices{at} + {bound}, indices{at})"
    body = [f"T.reads(indices{at})", f"T.writes(out{at})",
            f"assert 0 <= {fixed} and {fixed} < {bound}, (\"IndexError\", [{message!r}])",
            f"out{at} = {fixed}"]
    lines = ["@T.prim_func(private=True, s_tir=True)",
             "def guard(var_indices: T.handle, var_data: T.handle, var_out: T.handle):",
             f"    T.func_attr({{'op_pattern': {_OPAQUE}, 'tirx.is_scheduled': True, "
             "'tirx.noalias': True})"]
    lines += [f"    {name} = T.int64()" for name in idx_dims + data_dims]
    lines += [f"    indices = T.match_buffer(var_indices, ({_tuple(idx_dims)}), \"{dtype}\")",
              f"    data = T.match_buffer(var_data, ({_tuple(data_dims)}), \"{data_dtype}\")",
              f"    out = T.match_buffer(var_out, ({_tuple(idx_dims)}), \"{dtype}\")"]
    indent = "    "
    if loop:
        lines.append(f"{indent}for {', '.join(loop)} in T.grid({', '.join(idx_dims)}):")
        indent += "    "
    # A block around the body: the parser then adds the root block TVM's build passes require.
    lines.append(f'{indent}with T.sblock("guard"):')
    indent += "    "
    lines += [indent + line for line in body]
    return parsed("\n".join(lines))


def _tuple(names: list[str]) -> str:
    return ", ".join(names) + ("," if len(names) == 1 else "")


def _bound_source(use: IndexUse, data_dims: list[str], loop: list[str]) -> str:
    if use.nd_batch is None:
        return data_dims[use.axis if use.axis >= 0 else use.axis + len(data_dims)]
    # gather_nd: position j of the last index axis addresses data dim nd_batch + j.
    bound = data_dims[-1]
    for j in reversed(range(len(data_dims) - use.nd_batch - 1)):
        bound = f"T.Select({loop[-1]} == {j}, {data_dims[use.nd_batch + j]}, {bound})"
    return bound


@relax.expr_functor.mutator
class _Guarder(relax.PyExprMutator):
    """Re-emits every binding as it is, except calls with index arguments, whose indices it
    guards. Bindings are not re-normalized: a dynamic strided_slice re-normalized emits
    shape-function calls to a GlobalVar it never defines (ONNX Slice with run-time starts
    then failed in FuseOps)."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.kernels: dict[tuple, tvm.ir.GlobalVar] = {}

    def visit_var_binding_(self, binding) -> None:
        value = binding.value
        if (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and _index_uses(value)):
            binding = relax.VarBinding(binding.var, self.builder_.normalize(self._guarded(value)))
        self.builder_.emit_normalized(binding)

    def visit_match_cast_(self, binding) -> None:
        self.builder_.emit_normalized(binding)

    def _guarded(self, call: relax.Call) -> relax.Call:
        args = list(call.args)
        for use in _index_uses(call):
            args[use.arg] = self._guard_arg(args[use.arg], args[0], use, _short_op(call))
        if call.op.name == "relax.take":
            # Clip, not TVM's "fast" mode: the guard already made every index valid, and fast
            # mode prints a segfault warning per take at every compile.
            return relax.op.take(args[0], args[1], call.attrs.axis, "clip")
        return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)

    def _guard_arg(self, arg, data, use: IndexUse, op: str):
        if use.tuple_field is None:
            return self._guard(arg, data, use, op)
        fields = [self.builder_.emit(relax.TupleGetItem(arg, k))
                  for k in range(len(arg.ty.fields))]
        fields[use.tuple_field] = self._guard(fields[use.tuple_field], data, use, op)
        return self.builder_.emit(relax.Tuple(fields))

    def _guard(self, indices, data, use: IndexUse, op: str):
        indices = self._before_importer_wrap(indices, data, use)
        if isinstance(indices, tvm.ir.GenericConst):
            fixed = _normalize_constant(indices.value.numpy(), use, _static_dims(data), op)
            if fixed is not None:
                return relax.const(fixed, str(indices.ty.dtype))
        itype = indices.ty
        key = (itype.ndim, str(itype.dtype), data.ty.ndim, str(data.ty.dtype), use, op)
        if key not in self.kernels:
            kernel = guard_kernel(itype, data.ty.ndim, str(data.ty.dtype), use, op)
            self.kernels[key] = self.builder_.add_func(kernel, f"aotc_guard_{op}_indices")
        return self.builder_.emit(relax.call_tir(self.kernels[key], [indices, data], itype))


    def _before_importer_wrap(self, indices, data, use: IndexUse):
        """``i`` where ``indices`` is ``where(i < 0, i + extent, i)`` with the extent of the
        dimension the indices address: TVM's ONNX importer wraps negative indices so, and the
        guard's own normalization after it wrapped [-2n, -n) a second time (ONNX Gather index
        -5 on 4 rows read row 3 instead of failing). The guard alone is the ONNX/torch rule."""
        binding = self._binding(indices, "relax.where")
        if binding is None:
            return indices
        condition, wrapped, plain = binding.args
        less = self._binding(condition, "relax.less")
        add = self._binding(wrapped, "relax.add")
        if (less is None or add is None or not _same(less.args[0], plain)
                or not _same(add.args[0], plain) or not _is_zero(less.args[1])):
            return indices
        extent = add.args[1]
        if self._is_extent_of(extent, data, use):
            return plain
        bound = _normalize_bound(use, _static_dims(data), plain)
        if bound is None or not isinstance(extent, tvm.ir.GenericConst):
            return indices
        if np.array_equal(np.broadcast_to(extent.value.numpy(), np.shape(bound)), bound):
            return plain
        return indices

    def _is_extent_of(self, extent, data, use: IndexUse) -> bool:
        """Whether ``extent`` is ``take(shape_to_tensor(shape_of(data)), axis)``: the
        importer's form for a symbolic extent."""
        take = self._binding(extent, "relax.take")
        if take is None or use.nd_batch is not None:
            return False
        tensor = self._binding(take.args[0], "relax.shape_to_tensor")
        shape = self._binding(tensor.args[0], "relax.shape_of") if tensor is not None else None
        axis = use.axis if use.axis >= 0 else use.axis + data.ty.ndim
        return (shape is not None and _same(shape.args[0], data)
                and isinstance(take.args[1], tvm.ir.GenericConst)
                and take.args[1].value.numpy().ndim == 0
                and int(take.args[1].value.numpy()) in (axis, axis - data.ty.ndim))

    def _binding(self, expr, op_name: str):
        if not isinstance(expr, relax.Var):
            return None
        value = self.lookup_binding(expr)
        if (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name == op_name):
            return value
        return None


def _same(a, b) -> bool:
    return a.same_as(b)


def _is_zero(expr) -> bool:
    return (isinstance(expr, tvm.ir.GenericConst) and expr.value.numpy().ndim == 0
            and expr.value.numpy().item() == 0)


def _normalize_bound(use: IndexUse, dims: list, indices):
    """The extent(s) an index of ``use`` is normalized by (an int, or for gather_nd a vector
    over the last index axis); None where one is symbolic or unknown."""
    if use.nd_batch is None:
        return dims[use.axis if use.axis >= 0 else use.axis + len(dims)]
    last = _static_dims(indices)[-1] if indices.ty.ndim else None
    bound = dims[use.nd_batch:use.nd_batch + last] if last is not None else [None]
    return None if any(b is None for b in bound) else np.array(bound)


@tvm.transform.module_pass(opt_level=0, name="GuardIndices")
class GuardIndices:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_functions(mod, _Guarder(mod))
