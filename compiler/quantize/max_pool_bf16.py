"""MaxPoolBF16: with --precision bf16, a max pool whose result only bf16 convs read (through
ConvertBF16's ``to_bf16``) reads its input as bfloat16 bits: ``to_bf16(max_pool(x))`` becomes
``to_bf16(max_pool(from_bf16(to_bf16(x))))``, the widening inside the pool's kernel.

Why: an image model's stem (conv, bias, relu) feeds a max pool, and only the pool's result
went to bfloat16 for the next convs. The stem's output, the largest activation of such a
model (ResNet's 112x112x64), was written in float32 and read again by the pool. Now the
conversion is that tensor's only user and fuses into the stem's kernel, which writes 2 bytes
a value; the pool reads half the bytes.

Exact: rounding to bfloat16 is monotone, so the largest of the rounded values is the rounded
largest value, and the pool's result rounds to the same bits as before. The pool's padding
is applied to the widened values, as before.

Where: quantize phase, after ResidualFromBF16 (which leaves one conversion per tensor and has
residual adds read it, so that the pool's result has that conversion as its only user)."""

from __future__ import annotations

import tvm
from tvm import relax, topi

from .. import dot_kernels
from ..relax_walk import main_dataflow_blocks, mutate_functions, op_name
from .residual_from_bf16 import TO_BF16, conversion_of


def _converted_only(var, values: dict, users: dict) -> bool:
    readers = users.get(var, [])
    return bool(readers) and all(conversion_of(values.get(u)) is not None for u in readers)


def _pools(block: relax.DataflowBlock) -> set:
    """Vars of the max pools to rewrite: result read only by conversions to bfloat16, input
    a float32 tensor the pool alone reads, one layout in and out."""
    values = {b.var: b.value for b in block.bindings}
    users = relax.analysis.udchain(block)
    out = set()
    for var, value in values.items():
        if op_name(value) != "relax.nn.max_pool2d" or \
                value.attrs.layout != value.attrs.out_layout:
            continue
        x = value.args[0]
        if getattr(x.ty, "dtype", None) != "float32" or len(users.get(x, [])) != 1 or \
                x not in values or not _converted_only(var, values, users):
            continue
        out.add(var)
    return out


def _pool_of_bits(bits, attrs):
    """The max pool ``attrs`` describes, of the float32 values of bfloat16 ``bits`` (as
    LegalizeOps writes relax.nn.max_pool2d)."""
    return topi.nn.pool2d(dot_kernels.from_bf16_bits(bits), kernel=attrs.pool_size,
                          stride=attrs.strides, dilation=attrs.dilation,
                          padding=attrs.padding, pool_type="max", ceil_mode=attrs.ceil_mode,
                          layout=attrs.layout)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, pools: set):
        super().__init__(mod)
        self.pools = pools

    def visit_var_binding_(self, binding):
        if binding.var in self.pools:
            value = binding.value
            bits = self.builder_.emit_te(dot_kernels.to_bf16_bits,
                                         self.visit_expr(value.args[0]),
                                         primfunc_name_hint=TO_BF16)
            binding = relax.VarBinding(binding.var, self.builder_.call_te(
                _pool_of_bits, bits, value.attrs, primfunc_name_hint="max_pool2d_bf16"))
        super().visit_var_binding_(binding)


@tvm.transform.module_pass(opt_level=0, name="MaxPoolBF16")
class MaxPoolBF16:
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        pools = set().union(*(_pools(block) for block in main_dataflow_blocks(mod)))
        if not pools:
            return mod
        return mutate_functions(mod, _Rewriter(mod, pools))
