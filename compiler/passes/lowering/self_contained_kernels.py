"""SelfContainedKernels: Relax ops whose TVM kernels need TVM's compiler at run time become
aotc's TIR kernels: ``relax.sort``, ``relax.argsort``, ``relax.topk``, ``relax.median`` and
``relax.nonzero``.

Why: TVM's DispatchSortScan turns sort, argsort and top-k into calls of ``tvm.contrib.sort.*``,
packed functions of TVM's compiler library; nonzero runs as ``relax.run.nonzero``, a numpy
function TVM's Python package registers. A model using them ran in the process that compiled
it and failed in every other ("top-k compiles and then fails in a new process").

How: sort, argsort, top-k and median become ``call_te`` of default_schedules/sort_kernels.py (a
stable
merge sort, its permutation gathered and, for top-k, cut to k; median picks the lower middle);
nonzero counts the non-zero elements
first (that count is its output's extent) and then calls default_schedules/nonzero_kernel.py.

Where: before DispatchSortScan and LegalizeOps. compiler/runtime_deps.py refuses whatever
else would need the compiler at run time."""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax import op as R

from ...default_schedules import nonzero_kernel, sort_kernels
from ...relax_walk import mutate_if_any, op_name

OPS = ("relax.sort", "relax.argsort", "relax.topk", "relax.nonzero", "relax.median")


@relax.expr_functor.mutator
class _Mutator(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        name, attrs, bb = op_name(call), call.attrs, self.builder_
        if name == "relax.sort":
            return bb.call_te(sort_kernels.sort, call.args[0], int(attrs.axis),
                              not attrs.descending, primfunc_name_hint="aotc_sort")
        if name == "relax.argsort":
            return bb.call_te(sort_kernels.argsort, call.args[0], int(attrs.axis),
                              not attrs.descending, str(attrs.dtype),
                              primfunc_name_hint="aotc_argsort")
        if name == "relax.topk":
            return bb.call_te(sort_kernels.topk, call.args[0], int(attrs.k), int(attrs.axis),
                              str(attrs.ret_type), bool(attrs.largest), str(attrs.dtype),
                              primfunc_name_hint="aotc_topk")
        if name == "relax.nonzero":
            return self._nonzero(call.args[0])
        if name == "relax.median":
            axis = [int(a) for a in attrs.axis] if attrs.axis is not None else None
            return bb.call_te(sort_kernels.median, call.args[0], axis, bool(attrs.keepdims),
                              primfunc_name_hint="aotc_median")
        return call

    def _nonzero(self, data: relax.Expr) -> relax.Expr:
        bb = self.builder_
        dtype = str(data.ty.dtype)
        flags = data if dtype == "bool" else R.not_equal(data, relax.const(0, dtype))
        count = bb.emit(R.reshape(R.sum(R.astype(flags, "int64")), [1]))
        count_shape = bb.emit(R.tensor_to_shape(count))
        extent = tirx.Var("nonzero_count", "int64")
        bb.match_cast(count_shape, relax.ShapeType([extent]))
        return bb.call_te(nonzero_kernel.nonzero, data, extent,
                          primfunc_name_hint="aotc_nonzero")


@tvm.transform.module_pass(opt_level=0, name="SelfContainedKernels")
class SelfContainedKernels:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_if_any(mod, lambda expr: op_name(expr) in OPS, _Mutator)
