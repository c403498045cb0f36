"""FoldRemainingConstants: TVM's FoldConstant, run only where it has something to fold.

Why: TVM 0.27's FoldConstant legalizes every operator call of a dataflow block to see whether
its kernel's arguments are all constants, whatever the arguments are: every convolution and
elementwise op of a CNN, at each refold, a sizeable share of its compile
(docs/design/measurements.md) while folding nothing, since FoldConstantsNumpy, which runs just
before, folds what such models have. Where that is so, the rest of what FoldConstant does is
cheap and done here instead.

What: a call folds only when none of its arguments is computed at run time, i.e. every
variable it reads (inside tuples too) is bound to a constant or a shape. Where some call is
like that, or the module converts between shapes and tensors (FoldConstant evaluates those
specially), TVM's FoldConstant runs as before. Otherwise the module gets what FoldConstant
would have left it: variables bound to constants replaced by the constant where they are read,
and bindings nobody reads removed (FoldConstant's ``RemoveAllUnused``). The first such binding
is what FoldConstantsNumpy leaves behind when it folds.

Where: after FoldConstantsNumpy in the simplify and layout phases (folding.refold), and after
FuseAttention pads its masks."""

from __future__ import annotations

import tvm
from tvm import relax

from ...relax_walk import any_expr, with_functions

# FoldConstant evaluates these itself (not through a legalized kernel)
_SHAPE_OPS = frozenset({"relax.tensor_to_shape", "relax.shape_to_tensor"})


def _bound_constants(func: relax.Function) -> tuple[dict, set]:
    """(var -> the constant bound to it, vars bound to a constant or a shape) of ``func``."""
    bound = relax.analysis.get_var2val(func)
    constants = {var: value for var, value in bound.items()
                 if isinstance(value, tvm.ir.GenericConst)}
    shapes = {var for var, value in bound.items() if isinstance(value, relax.ShapeExpr)}
    return constants, set(constants) | shapes


def _reads_runtime_value(expr, known) -> bool:
    """Whether ``expr`` (a call argument) reads a variable that is neither a constant nor a
    shape bound in the function."""
    if isinstance(expr, relax.Var):
        return expr not in known
    if isinstance(expr, relax.Tuple):
        return any(_reads_runtime_value(field, known) for field in expr.fields)
    return False  # constants, shapes, prim values, data types, strings, global vars


def _foldable(expr, known) -> bool:
    """Whether TVM's FoldConstant could evaluate the call ``expr``."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and (
        expr.op.name in _SHAPE_OPS or
        not any(_reads_runtime_value(arg, known) for arg in expr.args))


@relax.expr_functor.mutator
class _InlineConstants(relax.PyExprMutator):
    """Variables bound to constants read as the constants themselves."""

    def __init__(self, constants: dict):
        super().__init__()
        self.constants = constants

    def visit_var_(self, var):
        return self.constants.get(var, var)

    def visit_dataflow_var_(self, var):
        return self.constants.get(var, var)


def fold_remaining_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """What TVM's FoldConstant makes of ``mod`` (see the module docstring)."""
    funcs = {gv: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
    bound = {gv: _bound_constants(func) for gv, func in funcs.items()}
    known = set().union(*(names for _, names in bound.values()))  # vars are per function
    if any_expr(mod, lambda expr: _foldable(expr, known)):
        return relax.transform.FoldConstant()(mod)
    replaced = {}
    for gv, func in funcs.items():
        constants = bound[gv][0]
        new = _InlineConstants(constants).visit_expr(func) if constants else func
        new = relax.analysis.remove_all_unused(new)
        if not new.same_as(func):
            replaced[gv] = new
    return with_functions(mod, replaced)


@tvm.transform.module_pass(opt_level=0, name="FoldRemainingConstants")
class FoldRemainingConstants:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return fold_remaining_constants(mod)
