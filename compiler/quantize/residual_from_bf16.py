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

The same for a block whose shortcut is a conv (a stage's first block: a downsampling 1x1
conv): the add sums two bf16 convs' float32 results, and FuseOps puts it into the kernel of
the one defined first (it fuses in binding order). The other, the shortcut, was written in
float32 for that kernel to read as a side input. It is now written as bfloat16 bits
(``to_bf16``, fused into its own kernel's epilogue) and the add widens them as it reads
(``add_bf16``): half the bytes written and read.

The price: the residual path carries bfloat16 values (8 bits of mantissa, float32's exponent
range, so nothing is clipped), as in OpenVINO's bf16 mode. Only conv activations are
rerouted: a transformer's residual stream stays float32.

Where: quantize phase, right after ConvertBF16 (it looks for the ``to_bf16`` conversions
ConvertBF16 writes in front of its conv kernels)."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from .. import dot_kernels
from ..relax_walk import main_dataflow_blocks, mutate_functions, op_name
from .residual_from_quantized import ResidualRerouter

TO_BF16 = "to_bf16"      # ConvertBF16's conversion kernels (compiler/quantize/bf16.py)
_CONV_BF16 = "conv2d_bf16"
# what may follow a conv's kernel on the way to the add: its bias or scale, by a constant
_CHAIN_OPS = ("relax.add", "relax.multiply")


def _callee(value) -> str:
    if op_name(value) != "relax.call_tir":
        return ""
    return value.args[0].name_hint


def conversion_of(value) -> relax.Expr | None:
    """x of a ConvertBF16 ``to_bf16(x)`` call, else None."""
    if not _callee(value).startswith(TO_BF16):
        return None
    [x] = value.args[1].fields
    return x


def _conv_result(var, values: dict, users: dict) -> bool:
    """Whether ``var`` is a bf16 conv's float32 result, or that result through adds and
    multiplies by constants (bias, scale), each value read only by the next."""
    while len(users.get(var, [])) == 1 and var in values:
        value = values[var]
        if _callee(value).startswith(_CONV_BF16):
            return True
        variables = [a for a in getattr(value, "args", [])
                     if not isinstance(a, tvm.ir.expr.Constant)]
        if op_name(value) not in _CHAIN_OPS or len(variables) != 1:
            return False
        var = variables[0]
    return False


def _shortcuts(values: dict, users: dict, order: dict) -> dict:
    """add var -> the operand it reads as bfloat16 bits: of an add of two bf16 convs' results
    of one shape, the one defined later (FuseOps gives the add to the other's kernel)."""
    out = {}
    for var, value in values.items():
        if op_name(value) != "relax.add":
            continue
        a, b = value.args
        if not (isinstance(a, relax.Var) and isinstance(b, relax.Var)) or a.same_as(b) or \
                not tvm_ffi.structural_equal(a.ty, b.ty):
            continue
        if _conv_result(a, values, users) and _conv_result(b, values, users):
            out[var] = a if order[a] > order[b] else b
    return out


def _plan(block: relax.DataflowBlock) -> tuple[dict, dict, dict]:
    """(duplicate conversion var -> the first conversion of its tensor; float32 var -> its
    conversion var, for tensors that bf16 convs and a later add read; add var -> its operand
    to read as bfloat16 bits, _shortcuts)."""
    values = {b.var: b.value for b in block.bindings}
    users = relax.analysis.udchain(block)
    order = {b.var: i for i, b in enumerate(block.bindings)}
    first, duplicates, rerouted = {}, {}, {}
    for var, value in values.items():
        x = conversion_of(value)
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
    return duplicates, rerouted, _shortcuts(values, users, order)


def _widened(builder: relax.BlockBuilder, bits: relax.Expr) -> relax.Expr:
    return builder.emit_te(dot_kernels.from_bf16_bits, bits, primfunc_name_hint="from_bf16")


def _add_narrowed(builder: relax.BlockBuilder, other: relax.Expr, side: relax.Expr):
    """``other + side`` with ``side`` passed as bfloat16 bits (to_bf16 of it, widened by the
    add)."""
    bits = builder.emit_te(dot_kernels.to_bf16_bits, side, primfunc_name_hint=TO_BF16)
    return builder.call_te(dot_kernels.add_bf16_bits, other, bits, primfunc_name_hint="add_bf16")


@tvm.transform.module_pass(opt_level=0, name="ResidualFromBF16")
class ResidualFromBF16:
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        duplicates, rerouted, shortcuts = {}, {}, {}
        for block in main_dataflow_blocks(mod):
            more_duplicates, more_rerouted, more_shortcuts = _plan(block)
            duplicates.update(more_duplicates)
            rerouted.update(more_rerouted)
            shortcuts.update(more_shortcuts)
        if not duplicates and not rerouted and not shortcuts:
            return mod
        return mutate_functions(mod, ResidualRerouter(mod, rerouted, _widened, duplicates,
                                                       shortcuts, _add_narrowed))
