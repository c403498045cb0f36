"""ResidualFromBF16: with --precision bf16, a tensor that bf16 convs read and a residual add
reads too is passed on as its bfloat16 copy only; the add reads that copy widened back to
float32. Two conversions of one tensor (a stage's first conv and its downsampling shortcut
both read the block's input) become one.

Why: the bf16 int8 twin of ResidualFromQuantized. A ResNet block's output feeds the next
block's first conv, which reads it as bfloat16 bits, and the residual add at that block's
end, which read it as float32. Two users kept FuseOps from putting the conversion into the
kernel that makes the tensor: the tensor was written in float32 and read again by a
``to_bf16`` kernel of its own. With the add reading ``from_bf16(xb)`` the conversion is the
tensor's only user and fuses into its producer's epilogue (which then writes 2 bytes a value,
not 4); the widening fuses into the add's kernel (cpu_dot inlines an epilogue's side input).
Measurements: docs/design/measurements.md#compilerquantizeresidual_from_bf16py.

The price: the residual path carries bfloat16 values (8 bits of mantissa, float32's exponent
range, so nothing is clipped), as in OpenVINO's bf16 mode. Only conv activations are
rerouted: a transformer's residual stream stays float32.

Where: quantize phase, right after ConvertBF16 (it looks for the ``to_bf16`` conversions
ConvertBF16 writes in front of its conv kernels)."""

from __future__ import annotations

import tvm
from tvm import relax

from .. import dot_kernels
from ..relax_walk import main_dataflow_blocks, mutate_functions, op_name
from .residual_from_quantized import ResidualRerouter

_TO_BF16 = "to_bf16"      # ConvertBF16's conversion kernels (compiler/quantize/bf16.py)
_CONV_BF16 = "conv2d_bf16"


def _callee(value) -> str:
    if op_name(value) != "relax.call_tir":
        return ""
    return value.args[0].name_hint


def _conversion_of(value) -> relax.Expr | None:
    """x of a ConvertBF16 ``to_bf16(x)`` call, else None."""
    if not _callee(value).startswith(_TO_BF16):
        return None
    [x] = value.args[1].fields
    return x


def _plan(block: relax.DataflowBlock) -> tuple[dict, dict]:
    """(duplicate conversion var -> the first conversion of its tensor; float32 var -> its
    conversion var, for tensors that bf16 convs and a later add read)."""
    values = {b.var: b.value for b in block.bindings}
    users = relax.analysis.udchain(block)
    order = {b.var: i for i, b in enumerate(block.bindings)}
    first, duplicates, rerouted = {}, {}, {}
    for var, value in values.items():
        x = _conversion_of(value)
        if x is None:
            continue
        if x in first:
            duplicates[var] = first[x]
            continue
        first[x] = var
    for x, xb in first.items():
        readers = [u for d in [xb, *(v for v, f in duplicates.items() if f is xb)]
                   for u in users.get(d, [])]
        if not readers or not all(_callee(values.get(u)).startswith(_CONV_BF16)
                                  for u in readers):
            continue
        if any(op_name(values.get(u)) == "relax.add" and order[u] > order[xb]
               for u in users.get(x, [])):
            rerouted[x] = xb
    return duplicates, rerouted


def _widened(builder: relax.BlockBuilder, bits: relax.Expr) -> relax.Expr:
    return builder.emit_te(dot_kernels.from_bf16_bits, bits, primfunc_name_hint="from_bf16")


@tvm.transform.module_pass(opt_level=0, name="ResidualFromBF16")
class ResidualFromBF16:
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        duplicates, rerouted = {}, {}
        for block in main_dataflow_blocks(mod):
            more_duplicates, more_rerouted = _plan(block)
            duplicates.update(more_duplicates)
            rerouted.update(more_rerouted)
        if not duplicates and not rerouted:
            return mod
        return mutate_functions(mod, ResidualRerouter(mod, rerouted, _widened, duplicates))
