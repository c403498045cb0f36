"""AttentionBF16: under ``--precision bf16``, the one-kernel attention FuseAttention grouped
(``softmax(Q @ Kt [* or / c] [+ mask]) @ V``) runs its two products as bfloat16 dot products
with float32 sums (compiler/attention_kernels.py), as ConvertBF16 does for the projections
around it.

Each call of a grouped attention function becomes four kernels:
    qb = to_bf16_bits(Q)            [..., S, D] bf16 bits
    kp = pack_keys(Kt)              [..., Sk/16, D/2, 16, 2]
    vp = pack_values(V)             [..., D/16, Sk/2, 16, 2]
    out = attention(qb, kp, vp, mask)   float32 [..., S, D]
FuseOps merges the first three into the head-split transposes that make Q, Kt and V, so each
is written once, in bf16 and in the order the kernel reads; the attention kernel is opaque to
FuseOps (nothing fused into it: the schedule, cpu_attention.Attention, takes it as it is).

Accuracy: the scores sum D products of bf16-rounded Q and K values in float32 (the same error
as a bf16 projection of that depth); the softmax is float32; the probabilities are rounded to
bf16 before the weighted sum of V, a relative error of at most 2^-8 each.

Taken where the target has AVX512-BF16 (the kernel's schedule needs ``vdpbf16ps``, or AMX
tiles where the target has them) and the head dim is a multiple of 16; FuseAttention has
already padded the key count to a multiple of 16. On AMX, static query rows are padded further,
to the 16-row tasks of the AMX schedule (_amx_rows). Elsewhere the float32 attention kernel
stays."""

from __future__ import annotations

import tvm
from tvm import relax

from aotc.targets import amx_bf16, bf16_dot

from .. import attention_kernels, dot_kernels
from ..default_schedules.cpu_attention import AMX_TASK_ROWS
from ..passes.fusion.attention import PATTERN_NAME
from ..relax_walk import mutate_functions, one_value, op_name

# op_pattern kOpaque: FuseOps fuses nothing into the kernel
_OPAQUE = 8


def _composite(func) -> bool:
    return isinstance(func, relax.Function) and func.attrs is not None and \
        str(func.attrs.get("Composite", "")) == PATTERN_NAME


def _static_dim(expr, axis: int) -> int | None:
    dims = getattr(getattr(expr.ty, "shape", None), "values", None)
    if dims is None:
        return None
    dim = dims[axis]
    return int(dim) if isinstance(dim, tvm.tirx.IntImm) else None


def _parts(func: relax.Function) -> dict | None:
    """The grouped chain read back: parameters for q, kt, v and mask, the scale (a number and
    whether it divides) and the NaN replacement of a safe softmax; None when it is not the
    chain FuseAttention makes."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    parts: dict = {"scale": None, "divide": False, "mask": None, "nan_value": None}
    chain = None  # the variable the chain has reached
    for binding in bindings:
        value, name = binding.value, op_name(binding.value)
        args = list(getattr(value, "args", []))
        if name == "relax.matmul" and "q" not in parts:
            parts["q"], parts["kt"] = args
        elif name == "relax.matmul":
            if not args[0].same_as(chain):
                return None
            parts["v"] = args[1]
            return parts if binding.var.same_as(func.body.body) else None
        elif name in ("relax.multiply", "relax.divide") and chain is not None:
            other = args[1] if args[0].same_as(chain) else args[0]
            parts["scale"], parts["divide"] = other, name == "relax.divide"
        elif name == "relax.add" and chain is not None:
            parts["mask"] = args[1] if args[0].same_as(chain) else args[0]
        elif name == "relax.nn.softmax" or name == "relax.isnan":
            pass
        elif name == "relax.where":
            parts["nan_value"] = args[1]
        else:
            return None
        chain = binding.var if name != "relax.isnan" else chain
    return None


def _amx_rows(rows: int | None, mask) -> int | None:
    """On AMX, the query rows a static count is padded to: a multiple of the 16-row tasks of
    cpu_attention (FuseAttention pads to 8; ViT's 197 tokens are 200, whose tasks of 8 rows would
    run half-height tiles); None where it already is one, the rows are symbolic, or a mask has
    rows of its own (the padded rows would read past it)."""
    if rows is None or rows % AMX_TASK_ROWS == 0:
        return None
    mask_rows = _static_dim(mask, -2) if mask is not None and \
        len(getattr(getattr(mask.ty, "shape", None), "values", [])) >= 2 else 1
    if mask_rows != 1:
        return None
    return -(-rows // AMX_TASK_ROWS) * AMX_TASK_ROWS


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, amx: bool):
        super().__init__(mod)
        self.mod = mod
        self.amx = amx
        self.kernels: set = set()

    def _bound(self, expr, params: dict):
        """A function parameter as the caller's argument (anything else, such as a constant
        inside the function, as it is)."""
        return params.get(expr, expr)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, relax.GlobalVar) or call.op not in self.mod:
            return call
        func = self.mod[call.op]
        if not _composite(func):
            return call
        parts = _parts(func)
        if parts is None:
            return call
        params = dict(zip(func.params, call.args))
        q, kt, v = (self._bound(parts[n], params) for n in ("q", "kt", "v"))
        depth, width = _static_dim(q, -1), _static_dim(v, -1)
        lanes = attention_kernels.LANES
        if depth is None or width is None or depth % lanes or width % lanes:
            return call
        numbers = {}
        for name in ("scale", "nan_value"):
            if parts[name] is None:
                numbers[name] = None
                continue
            numbers[name] = one_value(self._bound(parts[name], params))
            if numbers[name] is None:
                return call
        mask = None if parts["mask"] is None else self._bound(parts["mask"], params)
        bb = self.builder_
        qb = bb.emit_te(dot_kernels.to_bf16_bits, q, primfunc_name_hint="to_bf16")
        rows = _static_dim(q, -2)
        padded = _amx_rows(rows, mask) if self.amx else None
        if padded is not None:  # zero query rows (bf16 +0.0), their results sliced off
            widths = [0] * (2 * len(q.ty.shape.values))
            widths[-3] = padded - rows
            qb = bb.emit(relax.op.nn.pad(qb, widths))
        kp = bb.emit_te(attention_kernels.pack_keys, kt, primfunc_name_hint="pack_keys_bf16")
        vp = bb.emit_te(attention_kernels.pack_values, v,
                        primfunc_name_hint="pack_values_bf16")
        out = bb.emit_te(attention_kernels.attention, qb, kp, vp, mask,
                         scale=numbers["scale"], divide=parts["divide"],
                         nan_value=numbers["nan_value"], primfunc_name_hint="attention_bf16")
        # marked opaque once all are made: marked now, the next layer's identical kernel would
        # no longer match it and be added again
        self.kernels.add(bb.lookup_binding(out).args[0])
        if padded is not None:
            out = bb.emit(relax.op.strided_slice(out, axes=[len(q.ty.shape.values) - 2],
                                                 begin=[0], end=[rows], assume_inbound=True))
        return out


@tvm.transform.module_pass(opt_level=0, name="AttentionBF16")
class AttentionBF16:
    """``enabled`` False (precision fp32) leaves the module as it is; so does a target
    without AVX512-BF16."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if not self.enabled or target is None or bf16_dot(target) != "avx512-bf16":
            return mod
        if not any(_composite(f) for _, f in mod.functions_items()):
            return mod
        rewriter = _Rewriter(mod, bool(amx_bf16(target)))
        out = mutate_functions(mod, rewriter)
        for gv in rewriter.kernels:
            out[gv] = out[gv].with_attr("op_pattern", _OPAQUE)
        # the grouped functions no call reaches any more
        return relax.transform.DeadCodeElimination()(out)
