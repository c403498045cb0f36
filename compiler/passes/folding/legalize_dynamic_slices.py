"""LegalizeDynamicSlices: ``dynamic_strided_slice`` (run-time begin/end/strides) is lowered to
its TIR kernels before any ``FoldConstant`` sees it.

Why: TVM 0.27's FoldConstant tries each op's legalization to see whether it can fold it. The
legalization of ``dynamic_strided_slice`` emits a call to a shape-function PrimFunc into the
function being folded, but the PrimFunc itself lands in FoldConstant's scratch module, so the
result calls a function that does not exist ("There is no definition of
I.GlobalVar('shape_func')" in FuseOps). ONNX Slice with run-time starts and aotc's run-time-axes
reductions produce the op.

How: the op's own registered legalization, run with this pass's block builder, so that the
shape function and the slice kernel are added to the module.

Where: first in the pipeline, before the first FoldConstant.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...relax_walk import mutate_if_any

OPS = ("relax.dynamic_strided_slice",)


@relax.expr_functor.mutator
class _Legalizer(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name in OPS:
            legalize = call.op.get_attr("FLegalize")
            return legalize(self.builder_, call)
        return call


@tvm.transform.module_pass(opt_level=0, name="LegalizeDynamicSlices")
class LegalizeDynamicSlices:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_if_any(mod, _is_dynamic_slice, _Legalizer)


def _is_dynamic_slice(expr) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and \
        expr.op.name in OPS
