"""Shared by the pattern-based passes: apply one dataflow-pattern rewrite to every Relax
function of a module, then drop the bindings it left unused.

After any rewrite, TVM's ``rewrite_call`` compares the whole function with its previous form
and eliminates common subexpressions until neither changes, which reads every constant's data
each round: on a model with large weights a rewrite cost about a second however small it was
(docs/design/measurements.md, "Pattern rewrites and constants"). A pass whose rewriter does
not look at constant values passes ``opaque_constants=True``: its functions are rewritten with
each large constant standing in as a parameter of the same type, bound back afterwards."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import rewrite_call

# constants from this size on become parameters during an opaque-constant rewrite
OPAQUE_BYTES = 4096


def rewrite_module(mod: tvm.IRModule, pattern, rewriter, new_functions: dict | None = None,
                   opaque_constants: bool = False) -> tvm.IRModule:
    """``new_functions`` (GlobalVar -> function) is filled by the rewriter with the kernels its
    rewrites call; they are added to the module. With ``opaque_constants``, the rewriter sees
    large constants as variables (see the module docstring)."""
    rewrite = _rewrite_opaque if opaque_constants else rewrite_call
    updates = {gv: rewrite(pattern, rewriter, func)
               for gv, func in mod.functions_items() if isinstance(func, relax.Function)}
    mod = mod.clone()  # a Python module pass gets the caller's module itself: never edit it
    for gv, func in {**updates, **(new_functions or {})}.items():
        mod[gv] = func
    return relax.transform.DeadCodeElimination()(mod)


def _rewrite_opaque(pattern, rewriter, func: relax.Function) -> relax.Function:
    stand_ins: dict = {}  # constant -> its parameter

    def visit(expr):
        if isinstance(expr, tvm.ir.GenericConst) and expr not in stand_ins and \
                _nbytes(expr) >= OPAQUE_BYTES:
            stand_ins[expr] = relax.Var(f"aotc_constant_{len(stand_ins)}", expr.ty)
    relax.analysis.post_order_visit(func.body, visit)
    if not stand_ins:
        return rewrite_call(pattern, rewriter, func)
    opened = relax.Function(list(func.params) + list(stand_ins.values()),
                            _Replace(stand_ins).visit_expr(func.body), func.ret_ty,
                            func.is_pure, func.attrs, func.span)
    rewritten = rewrite_call(pattern, rewriter, opened)
    if tvm_ffi.structural_equal(rewritten, opened):  # cheap here: the large data is out
        return func
    return rewritten.bind_params({var: const for const, var in stand_ins.items()})


def _nbytes(constant: tvm.ir.GenericConst) -> int:
    """The size of a tensor constant's data (0 for other constants)."""
    data = constant.value
    if not isinstance(data, tvm.runtime.Tensor):
        return 0
    count = 1
    for dim in data.shape:
        count *= int(dim)
    return count * tvm.runtime.DataType(str(data.dtype)).itemsize


@relax.expr_functor.mutator
class _Replace(relax.PyExprMutator):
    def __init__(self, stand_ins: dict):
        super().__init__()
        self.stand_ins = stand_ins

    def visit_generic_const_(self, const: tvm.ir.GenericConst) -> relax.Expr:
        return self.stand_ins.get(const, const)
