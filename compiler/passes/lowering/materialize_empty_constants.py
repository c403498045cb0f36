"""MaterializeEmptyConstants: constants with zero elements become tensors made at run time.

Why: FoldConstant turns anything computed from an empty tensor into a constant (it has no data
to depend on), and TVM 0.27 writes zero-size constants into the ``.so`` in a form its own
loader rejects ("Invalid DLTensor file format"): the model compiled and could never be loaded
(ONNX reductions over empty sets, a kernel-size-1 causal convolution with an empty state).

How: each such constant is replaced by the result of a kernel that allocates its shape and
writes nothing (every loop has extent 0). Any tensor of that shape is the constant.

Where: after the last FoldConstant (the end of the schedule phase), so nothing folds it back.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...relax_walk import mutate_if_any
from ...tvmscript import parsed


def _empty_kernel(shape: tuple[int, ...], dtype: str) -> tvm.tirx.PrimFunc:
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    loops = ", ".join(f"i{k}" for k in range(len(shape)))
    source = f"""
@T.prim_func(private=True, s_tir=True)
def empty(out: T.Buffer(({dims}), "{dtype}")):
    T.func_attr({{"tirx.is_scheduled": True, "tirx.noalias": True}})
    for {loops} in T.grid({dims}):
        with T.sblock("nothing"):
            T.reads()
            T.writes(out[{loops}])
            out[{loops}] = T.Cast("{dtype}", 0)
"""
    return parsed(source)


@relax.expr_functor.mutator
class _Materializer(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.kernels: dict[tuple, tvm.ir.GlobalVar] = {}

    def visit_generic_const_(self, const) -> relax.Expr:
        shape = tuple(int(d) for d in const.value.shape)
        if not shape or all(d > 0 for d in shape):
            return const
        dtype = str(const.value.dtype)
        key = (shape, dtype)
        if key not in self.kernels:
            self.kernels[key] = self.builder_.add_func(_empty_kernel(shape, dtype),
                                                       "aotc_empty_tensor")
        return self.builder_.emit(relax.call_tir(self.kernels[key], [],
                                                 relax.TensorType(shape, dtype)))


@tvm.transform.module_pass(opt_level=0, name="MaterializeEmptyConstants")
class MaterializeEmptyConstants:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_if_any(mod, _is_empty_constant, _Materializer)


def _is_empty_constant(expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and 0 in tuple(expr.value.shape)
