"""ResidualFromQuantized: a residual add reads the uint8 copy of a tensor that an int8 conv
already quantized, not the float32 tensor itself.

Why: in MobileNetV2 (and ResNets) a block's output feeds the next block's first conv, which
wants it as uint8, and a residual add two convs later, which read it as float32. Two users of
different precision kept FuseOps from putting the quantize into the kernel that makes the
tensor: each such tensor was written in float32 and read again by a quantize kernel of its
own (10 of MobileNetV2's 54 kernels). With the add reading ``dequantize(xq)`` the quantize is
the tensor's only user and fuses into its producer's epilogue; the dequantize fuses into the
add's kernel. onnxruntime's quantized models (QDQ) do the same: the add's inputs are the
dequantized int8 tensors. So, as there, values outside the calibrated range are clipped on
the residual path too. Only conv activations are rerouted: transformers' residual streams
carry outliers that int8 would clip.

It needs cpu_dot's inlining of an epilogue's side input: scheduled as a pass of its own, the
dequantize would make the model slower. Measurements:
docs/design/measurements.md#compilerquantizeresidual_from_quantizedpy.

Where: quantize phase, between AnnotateInt8 and RealizeInt8 (it looks for the
quantize/dequantize pairs annotate wrote in front of conv2d sites).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_walk import main_dataflow_blocks, mutate_functions, op_name


def _rerouted(block: relax.DataflowBlock) -> dict:
    """float32 var -> the dequantize var of its uint8 copy, for activations of conv2d sites
    that a later ``add`` also reads."""
    values = {b.var: b.value for b in block.bindings}
    users = relax.analysis.udchain(block)
    order = {b.var: i for i, b in enumerate(block.bindings)}
    out = {}
    for var, value in values.items():
        if op_name(value) != "relax.dequantize" or value.args[0] not in values:
            continue
        quantize = values[value.args[0]]
        if op_name(quantize) != "relax.quantize" or quantize.ty.dtype != "uint8":
            continue
        if not any(op_name(values.get(u)) == "relax.nn.conv2d" for u in users.get(var, [])):
            continue
        x = quantize.args[0]
        if any(op_name(values.get(u)) == "relax.add" and order[u] > order[var]
               for u in users.get(x, [])):
            out[x] = var
    return out


@relax.expr_functor.mutator
class ResidualRerouter(relax.PyExprMutator):
    """Adds that read a rerouted tensor ``x`` read ``read(builder, rerouted[x])`` instead (the
    copy itself by default), once that copy is defined; bindings in ``duplicates`` (var ->
    the var it repeats) are dropped and their uses read the var they repeat; an add in
    ``shortcuts`` (add var -> one of its operands) becomes ``add_shortcut(builder, other
    operand, that operand)``. Shared by ResidualFromQuantized and ResidualFromBF16."""

    def __init__(self, mod, rerouted: dict, read=None, duplicates: dict | None = None,
                 shortcuts: dict | None = None, add_shortcut=None):
        super().__init__(mod)
        self.rerouted, self.duplicates = rerouted, duplicates or {}
        self.read = read or (lambda _builder, copy: copy)
        self.shortcuts, self.add_shortcut = shortcuts or {}, add_shortcut
        self.defined = set()  # copies already emitted (an add may only read those)

    def visit_var_binding_(self, binding):
        if binding.var in self.duplicates:
            self.set_var_remap(binding.var, self.visit_expr(self.duplicates[binding.var]))
            return
        value = binding.value
        side = self.shortcuts.get(binding.var)
        if side is not None:
            [other] = [a for a in value.args if not a.same_as(side)]
            binding = relax.VarBinding(binding.var, self.add_shortcut(
                self.builder_, self.visit_expr(other), self.visit_expr(side)))
        elif op_name(value) == "relax.add" and any(
                a in self.rerouted and self.rerouted[a] in self.defined for a in value.args):
            args = [self.read(self.builder_, self.visit_expr(self.rerouted[a]))
                    if a in self.rerouted else a for a in value.args]
            binding = relax.VarBinding(binding.var, relax.Call(value.op, args, value.attrs))
        super().visit_var_binding_(binding)
        self.defined.add(binding.var)


@tvm.transform.module_pass(opt_level=0, name="ResidualFromQuantized")
class ResidualFromQuantized:
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        rerouted = {}
        for block in main_dataflow_blocks(mod):
            rerouted.update(_rerouted(block))
        if not rerouted:
            return mod
        return mutate_functions(mod, ResidualRerouter(mod, rerouted))
