"""SortToTIR: ``relax.sort``, ``relax.argsort`` and ``relax.topk`` become aotc's TIR kernels.

Why: TVM's DispatchSortScan turns them into calls of ``tvm.contrib.sort.*``, packed functions
of TVM's compiler library: the model then fails to run in any process that has not loaded the
compiler ("top-k compiles and then fails in a new process").

How: each call is replaced by ``call_te`` of lower/sort_kernels.py (a stable merge sort, its
permutation gathered and, for top-k, cut to k).

Where: before DispatchSortScan, which then has only scans (cumsum, cumprod) left to dispatch."""

from __future__ import annotations

import tvm
from tvm import relax

from ...lower import sort_kernels
from ...relax_walk import mutate_if_any, op_name

SORT_OPS = ("relax.sort", "relax.argsort", "relax.topk")


@relax.expr_functor.mutator
class _SortMutator(relax.PyExprMutator):
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
        return call


@tvm.transform.module_pass(opt_level=0, name="SortToTIR")
class SortToTIR:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_if_any(mod, lambda expr: op_name(expr) in SORT_OPS, _SortMutator)
