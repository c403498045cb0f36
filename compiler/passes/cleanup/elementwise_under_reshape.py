"""ElementwiseUnderReshape: an elementwise chain between a reshape and the reshape back runs
on the tensor before the first reshape, and both reshapes go.

``reshape(x, s)`` followed by elementwise ops (their other operands scalars or vectors along
the last axis, which both shapes share) whose results only feed those ops and a
``reshape(..., shape of x)``: the ops take ``x`` instead, and the reshape back becomes their
result.

Why: GPT-2's exported MLP computes its matmuls on [tokens, features] and its GELU on
[1, tokens, features], with a reshape on each side. FuseOps fuses elementwise epilogues into a
matmul but not across a reshape, so the GELU was a kernel of its own: one more pass over the
[tokens, 3,072] activation, written and read back from memory. On the matmul's own shape it
fuses into the matmul's epilogue.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...frontends.relax_shapes import static_shape
from ...relax_walk import mutate_functions, op_name

_UNARY = {"relax.tanh", "relax.erf", "relax.exp", "relax.sigmoid", "relax.sqrt", "relax.rsqrt",
          "relax.negative", "relax.abs", "relax.log", "relax.square", "relax.nn.relu",
          "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu"}
_BINARY = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power",
           "relax.maximum", "relax.minimum"}


def _along_last_axis(expr, shape: list[int], rank: int) -> bool:
    """A tensor that broadcasts onto ``shape`` the same way onto any shape of the same last
    axis and at least ``rank`` dims: a scalar or a vector along the last axis."""
    own = static_shape(expr)
    if own is None or len(own) > rank:
        return False
    return all(d == 1 for d in own[:-1]) and (not own or own[-1] in (1, shape[-1]))


def _chains(block: relax.DataflowBlock) -> tuple[dict, dict]:
    """({first-reshape or elementwise var: the first reshape's source}, {reshape-back var: the
    chain var it reads}) for every chain in ``block`` that ElementwiseUnderReshape rewrites.
    Bindings come in dataflow order, so each reader of a chain var is classified after every
    chain var it reads."""
    bindings = [b for b in block.bindings if isinstance(b, relax.VarBinding)]
    members, ends = {}, {}
    for at, binding in enumerate(bindings):
        value = binding.value
        if op_name(value) != "relax.reshape" or binding.var in members:
            continue
        source, outer = static_shape(value.args[0]), static_shape(binding.var)
        if not source or not outer or source == outer or source[-1] != outer[-1]:
            continue
        found = _chain(binding.var, source, outer, bindings[at + 1:])
        if found is not None and found[1] and len(found[0]) > 1:
            members.update({var: value.args[0] for var in found[0]})
            ends.update(found[1])
    return members, ends


def _chain(start, source: list[int], outer: list[int], later: list) -> tuple | None:
    """(the chain's vars, {reshape-back var: the chain var it reads}) from the reshape to
    ``start``; None where a reader of the chain is neither in it nor a reshape back."""
    chain, back = {start}, {}
    for binding in later:
        if not any(v in chain for v in relax.analysis.free_vars(binding.value)):
            continue
        if not isinstance(binding.var, relax.DataflowVar):  # read after the block
            return None
        if op_name(binding.value) == "relax.reshape" and static_shape(binding.var) == source:
            back[binding.var] = binding.value.args[0]
        elif _elementwise(binding.value, chain, outer, len(source)):
            chain.add(binding.var)
        else:
            return None
    return chain, back


def _elementwise(call, chain: set, shape: list[int], rank: int) -> bool:
    name = op_name(call)
    if name not in _UNARY and name not in _BINARY or static_shape(call) != shape:
        return False
    tensors = [a for a in call.args if isinstance(a.ty, relax.TensorType)]
    if len(tensors) != len(call.args) or not any(a in chain for a in tensors):
        return False
    return all(a in chain or _along_last_axis(a, shape, rank) for a in tensors)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.members: dict = {}
        self.ends: dict = {}
        self.flat: dict = {}  # chain var -> its value on the source's shape

    def visit_dataflow_block_(self, block):
        self.members, self.ends = _chains(block)
        return super().visit_dataflow_block_(block)

    def visit_var_binding_(self, binding):
        var = binding.var
        if var in self.ends:
            self.set_var_remap(var, self.flat[self.ends[var]])
            return
        if var not in self.members:
            super().visit_var_binding_(binding)
            return
        value = binding.value
        if op_name(value) == "relax.reshape":
            self.flat[var] = self.visit_expr(value.args[0])
            return
        args = [self.flat[a] if a in self.flat else self.visit_expr(a) for a in value.args]
        self.flat[var] = self.builder_.emit(relax.Call(value.op, args, value.attrs),
                                            name_hint=var.name)


@tvm.transform.module_pass(opt_level=0, name="ElementwiseUnderReshape")
class ElementwiseUnderReshape:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_functions(mod, _Rewriter(mod))
