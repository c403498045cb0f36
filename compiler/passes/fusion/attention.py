"""FuseAttention: scaled-dot-product attention, ``softmax(Q @ Kt [* or / c] [+ mask]) @ V``, is
grouped into one Relax function, which LegalizeOps and FuseTIR turn into one kernel (the CPU rule
``Attention`` in compiler/default_schedules schedules it row block by row block, so the full score
matrix is
never written: each parallel task keeps a few rows of scores in L1).

Why: FuseOps cuts attention into three kernels (scores, softmax, weighted sum) that write and
re-read the whole (heads x queries x keys) score matrix twice, so they run at half the rate of
the projections around them.

The key length is first padded to a multiple of 16 floats (one AVX-512 register) when it is
not one: K and V get zero rows, and the scores of the padded keys get the lowest float32 added,
so that softmax gives them weight 0 (exp underflows to exactly 0) and the result is unchanged.
Then every vector loop of the kernel runs on whole registers (197 keys left the score loop
scalar). Query rows are padded to a multiple of 8 (zero rows, sliced off the result): with 197
rows the bounds check of the last row block sat in every inner loop and the kernel took 2.2x
as long as with 200. A symbolic length (a model exported with dynamic axes) is always padded,
by the kernels of compiler/symbolic_padding.py, and the rows sliced back.

Matched only when it is safe to change: float32, a static head dim, the same batch dims on Q,
Kt and V (no broadcasting), softmax over the last axis, a scalar scale, a mask that broadcasts
to the scores, and no intermediate (scores, probabilities) read anywhere else.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.transform import FusionPattern
from tvm.sym import Analyzer

from ... import symbolic_padding
from ...relax_walk import any_expr, value_uses
from ..folding.fold_remaining_constants import fold_remaining_constants
from ..pattern_rewrite import rewrite_module

KEY_MULTIPLE = 16  # float32 lanes of one AVX-512 register; a multiple of AVX2's 8
QUERY_MULTIPLE = 8  # query rows: whole row blocks of the kernel's parallel tasks
PATTERN_NAME = "aotc.attention"
_ANALYZER = Analyzer()


def _attention_pattern():
    q, kt, v, mask, scale = wildcard(), wildcard(), wildcard(), wildcard(), is_const()
    scores = is_op("relax.matmul")(q, kt)
    scaled = (is_op("relax.multiply")(scores, scale) | is_op("relax.multiply")(scale, scores)
              | is_op("relax.divide")(scores, scale) | scores)
    masked = is_op("relax.add")(scaled, mask) | is_op("relax.add")(mask, scaled) | scaled
    softmax = is_op("relax.nn.softmax")(masked)
    # torch exports softmax as "safe": where(isnan(p), 0, p), for rows masked entirely
    nan_value = is_const()
    probs = is_op("relax.where")(is_op("relax.isnan")(softmax), nan_value, softmax) | softmax
    out = is_op("relax.matmul")(probs, v)
    parts = {"q": q, "kt": kt, "v": v, "mask": mask, "scale": scale, "scores": scores,
             "scaled": scaled, "masked": masked, "softmax": softmax, "nan_value": nan_value,
             "probs": probs}
    return out, parts


_PART_NAMES = tuple(_attention_pattern()[1])


def _float32(expr) -> bool:
    return str(getattr(expr.ty, "dtype", "")) == "float32"


def _shape(expr: relax.Expr) -> list | None:
    """The tensor's dims (ints, or PrimExprs where symbolic), or None when not known."""
    shape = getattr(expr.ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None:
        return None
    return [int(d) if isinstance(d, tirx.IntImm) else d for d in values]


def _same(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return _ANALYZER.can_prove_equal(a, b)


def _broadcasts_to(shape: list, target: list) -> bool:
    if len(shape) > len(target):
        return False
    return all(_same(s, 1) or _same(s, t) for s, t in zip(reversed(shape), reversed(target)))


def _fits(m: dict) -> bool:
    """The chain can become one attention kernel (see the module docstring)."""
    q, kt, v, out = m["q"], m["kt"], m["v"], m["out"]
    shapes = [_shape(e) for e in (q, kt, v, out)]
    if any(s is None for s in shapes) or not all(_float32(e) for e in (q, kt, v, out)):
        return False
    sq, skt, sv, _ = shapes
    if not (len(sq) == len(skt) == len(sv) >= 2 and
            all(_same(a, b) and _same(b, c) for a, b, c in zip(sq[:-2], skt[:-2], sv[:-2]))):
        return False
    if not (_same(sq[-1], skt[-2]) and _same(skt[-1], sv[-2])):
        return False
    if not all(isinstance(d, int) for d in (sq[-1], sv[-1])):
        return False  # the head dims: the kernel's register tiles are built for them
    axis = int(m["softmax"].attrs.axis)
    if axis not in (-1, len(sq) - 1):
        return False
    if "scale" in m and int(np.prod(m["scale"].value.numpy().shape)) != 1:
        return False
    if "mask" in m:
        mask_shape = _shape(m["mask"])
        scores = sq[:-1] + [skt[-1]]
        if mask_shape is None or not _float32(m["mask"]) or not _broadcasts_to(mask_shape,
                                                                               scores):
            return False
    return True


def _matched(pattern_parts: dict, matchings, out) -> dict:
    found = {name: matchings[p] for name, p in pattern_parts.items() if p in matchings}
    found["out"] = out
    return found


# --- step 1: pad the key length ------------------------------------------------------------

class _PadKernels:
    """The padding kernels of symbolic lengths (compiler/symbolic_padding.py), made on demand
    and added to the module by rewrite_module."""

    def __init__(self):
        self.functions: dict = {}
        self._by_key: dict = {}

    def pad(self, x: relax.Expr, shape: list, axis: int, multiple: int, value: float,
            padded) -> relax.Expr:
        static = tuple(d if isinstance(d, int) else None for d in shape)
        key = (static, axis, multiple, value)
        if key not in self._by_key:
            func = _pad_kernel(static, axis, multiple, value)
            fill = "_lowest" if value else ""
            gv = relax.GlobalVar(f"aotc_pad{len(self._by_key)}_axis{axis}_to{multiple}{fill}")
            relax.expr._update_type(gv, func.ty)  # call_tir checks its callee's type
            self._by_key[key] = gv
            self.functions[gv] = func
        out_shape = list(shape)
        out_shape[axis] = padded
        return relax.call_tir(self._by_key[key], [x],
                              relax.TensorType(relax.ShapeExpr(out_shape), "float32"))


def _pad_kernel(static: tuple, axis: int, multiple: int, value: float) -> tirx.PrimFunc:
    """Static dims stay static (the copy vectorizes over a static head dim)."""
    dims = [tirx.Var(f"n{k}", "int64") if d is None else tirx.IntImm("int64", d)
            for k, d in enumerate(static)]
    x = te.placeholder(dims, "float32", name="x")
    out = symbolic_padding.pad_axis(x, axis, multiple, value)
    func = te.create_prim_func([x, out]).without_attr("global_symbol")  # private
    # opaque to FuseOps: fused with a neighbour (the mask's where), FuseTIR found the
    # kernel's own dim vars inconsistent with the neighbour's
    return func.with_attr("op_pattern", 8)


def _pad_last(x: relax.Expr, shape: list, axis_from_end: int, padded, kernels: _PadKernels,
              multiple: int, value: float = 0.0) -> relax.Expr:
    """``x`` (of ``shape``) with ``value`` after the end of axis ``-axis_from_end`` up to
    ``padded`` entries (the extent rounded up to ``multiple``)."""
    rank, axis = len(shape), len(shape) - axis_from_end
    if isinstance(padded, int) and value == 0.0:
        widths = [0] * (2 * rank)
        widths[2 * axis + 1] = padded - shape[axis]
        return relax.op.nn.pad(x, widths)
    return kernels.pad(x, shape, axis, multiple, value, padded)


def _key_mask(keys, padded_keys, kernels: _PadKernels) -> relax.Expr:
    """0 for the real keys, the lowest float32 for the padded ones (softmax gives them 0)."""
    lowest = float(np.finfo(np.float32).min)
    if isinstance(keys, int):
        values = np.zeros(padded_keys, dtype="float32")
        values[keys:] = lowest
        return relax.const(values)
    zeros = relax.op.zeros(relax.ShapeExpr([keys]), "float32")
    return _pad_last(zeros, [keys], 1, padded_keys, kernels, KEY_MULTIPLE, lowest)


def _padded_chain(m: dict, kernels: _PadKernels) -> relax.Expr | None:
    sq, skt, sv = _shape(m["q"]), _shape(m["kt"]), _shape(m["v"])
    queries, keys = sq[-2], skt[-1]
    padded_keys = symbolic_padding.round_up(keys, KEY_MULTIPLE)
    padded_rows = symbolic_padding.round_up(queries, QUERY_MULTIPLE)
    pad_keys = not _same(padded_keys, keys)
    pad_rows = not _same(padded_rows, queries)
    if not pad_keys and not pad_rows:
        return None

    q = _pad_last(m["q"], sq, 2, padded_rows, kernels, QUERY_MULTIPLE) if pad_rows else m["q"]
    kt = _pad_last(m["kt"], skt, 1, padded_keys, kernels, KEY_MULTIPLE) if pad_keys else m["kt"]
    v = _pad_last(m["v"], sv, 2, padded_keys, kernels, KEY_MULTIPLE) if pad_keys else m["v"]
    scores = relax.op.matmul(q, kt)
    if "scale" in m:
        op = m["scaled"].op.name
        scores = (relax.op.divide(scores, m["scale"]) if op == "relax.divide"
                  else relax.op.multiply(scores, m["scale"]))
    # One mask (the model's, if any, with the padded keys' lowest float): the fused chain has
    # one add. With static shapes the model's mask is padded with zeros and the constant key
    # mask added (the sum folds at compile time); with a symbolic length the model's mask is
    # padded with the lowest float itself (one kernel less).
    mask, keys_masked = None, not pad_keys
    if "mask" in m:
        user, shape = m["mask"], _shape(m["mask"])
        if pad_keys and shape and _same(shape[-1], keys):  # not a scalar (rank 0) mask
            lowest = 0.0 if isinstance(keys, int) else float(np.finfo(np.float32).min)
            user = _pad_last(user, shape, 1, padded_keys, kernels, KEY_MULTIPLE, lowest)
            shape = shape[:-1] + [padded_keys]
            keys_masked = lowest != 0.0
        if len(shape) >= 2 and pad_rows and _same(shape[-2], queries):
            user = _pad_last(user, shape, 2, padded_rows, kernels, QUERY_MULTIPLE)
        mask = user
    if not keys_masked:
        key_mask = _key_mask(keys, padded_keys, kernels)
        mask = key_mask if mask is None else relax.op.add(mask, key_mask)
    if mask is not None:
        scores = relax.op.add(scores, mask)
    probs = relax.op.nn.softmax(scores, axis=-1)
    if "nan_value" in m:
        probs = relax.op.where(relax.op.isnan(probs), m["nan_value"], probs)
    out = relax.op.matmul(probs, v)
    if pad_rows:
        out = relax.op.strided_slice(out, axes=[len(sq) - 2], begin=[0], end=[queries],
                                     assume_inbound=True)
    return out


def _intermediates_single_use(m: dict, uses: dict) -> bool:
    """Scores and probabilities read only by the chain itself (else fusing would compute
    them twice): once each, and a safe softmax's twice (its isnan and where)."""
    if "nan_value" in m and uses.get(m["softmax"]) != 2:
        return False
    return all(uses.get(m[n]) == 1 for n in ("scores", "scaled", "masked", "probs") if n in m)


def _padding_rewriter(parts: dict, uses: dict, kernels: _PadKernels):
    def rewrite(expr, matchings):
        m = _matched(parts, matchings, expr)
        if not _fits(m) or not _intermediates_single_use(m, uses):
            return expr
        padded = _padded_chain(m, kernels)
        return expr if padded is None else padded
    return rewrite


# --- step 2: group the chain ---------------------------------------------------------------

def _group_check(context) -> bool:
    m = {name: context.annotated_expr[name] for name in _PART_NAMES
         if name in context.annotated_expr}
    m["out"] = context.matched_expr
    if not _fits(m) or not symbolic_padding.multiple_of(_shape(m["kt"])[-1], KEY_MULTIPLE):
        return False
    inside = set(context.matched_bindings.keys())
    for var in inside:
        if var.same_as(context.value_to_bound_var.get(context.matched_expr)):
            continue
        if any(user not in inside for user in context.var_usages.get(var, [])):
            return False
    return True


def attention_fusion_pattern() -> FusionPattern:
    pattern, parts = _attention_pattern()
    return FusionPattern(PATTERN_NAME, pattern, parts, _group_check)


def _is_softmax(expr) -> bool:
    return isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.nn.softmax"


@tvm.transform.module_pass(opt_level=0, name="FuseAttention")
class FuseAttention:
    """Pad ragged key lengths, then group every attention chain into one primitive function."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not any_expr(mod, _is_softmax):
            return mod  # DenseNet-121 spent 0.6 s here matching nothing
        pattern, parts = _attention_pattern()
        kernels = _PadKernels()
        mod = rewrite_module(mod, pattern,
                             _padding_rewriter(parts, value_uses(mod), kernels),
                             kernels.functions)
        mod = fold_remaining_constants(mod)  # padded constant masks
        return relax.transform.FuseOpsByPattern([attention_fusion_pattern()],
                                                bind_constants=False)(mod)
