"""ScalarKernelsApart: kernels that read no tensor, only scalars (``shape_to_tensor`` of
symbolic dims: an ONNX ``Shape`` of a tensor with dynamic axes), are kept out of fusion.

Why: FuseOps fused such a kernel into its elementwise consumer, and FuseTIR then failed
("VarRemapGet(source) == nullptr" in RenewDefs) when the fused function took the same
symbolic dim both as a scalar argument and through a tensor's shape: a decoder exported with
past keys and values (total length = past + new tokens) did not compile.

How: after AnnotateTIROpPattern, each kernel that some ``call_tir`` calls with scalar
arguments only is marked opaque (op_pattern 8). Such kernels write a few integers; keeping
them apart costs one tiny call each.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...relax_walk import is_scalar, visit_functions, with_functions

OPAQUE = 8  # TVM's kOpaque


def _scalar_only_kernels(mod: tvm.IRModule) -> set[str]:
    names: set[str] = set()
    call_tir = tvm.ir.Op.get("relax.call_tir")

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op == call_tir:
            args = expr.args[1].fields if hasattr(expr.args[1], "fields") else []
            if args and all(is_scalar(a) for a in args):
                names.add(expr.args[0].name_hint)
    visit_functions(mod, visit)
    return names


@tvm.transform.module_pass(opt_level=0, name="ScalarKernelsApart")
class ScalarKernelsApart:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return with_functions(mod, {name: mod[name].with_attr("op_pattern", OPAQUE)
                                     for name in _scalar_only_kernels(mod)})
