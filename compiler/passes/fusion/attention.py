"""FuseAttention: scaled-dot-product attention, ``softmax(Q @ Kt [* or / c] [+ mask]) @ V``, is
grouped into one Relax function, which LegalizeOps and FuseTIR turn into one kernel (the CPU rule
``Attention`` in compiler/lower schedules it row block by row block, so the full score matrix is
never written: each parallel task keeps a few rows of scores in L1).

Why: FuseOps cuts attention into three kernels (scores, softmax, weighted sum) that write and
re-read the whole (heads x queries x keys) score matrix twice; on the ViT-style encoder (197
tokens) they ran at 64-97 GFLOP/s against ~190 for its projections.

The key length is first padded to a multiple of 16 floats (one AVX-512 register) when it is
not one: K and V get zero rows, and the scores of the padded keys get the lowest float32 added,
so that softmax gives them weight 0 (exp underflows to exactly 0) and the result is unchanged.
Then every vector loop of the kernel runs on whole registers (197 keys left the score loop
scalar). Query rows are padded to a multiple of 8 (zero rows, sliced off the result): with 197
rows the bounds check of the last row block sat in every inner loop and the kernel took 2.2x
as long as with 200.

Matched only when it is safe to change: float32, static shapes, the same batch dims on Q, Kt and
V (no broadcasting), softmax over the last axis, a scalar scale, a mask that broadcasts to the
scores, and no intermediate (scores, probabilities) read anywhere else.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard
from tvm.relax.transform import FusionPattern

from ...frontends.relax_shapes import static_shape
from ...relax_walk import any_expr, single_use_values
from ..pattern_rewrite import rewrite_module

KEY_MULTIPLE = 16  # float32 lanes of one AVX-512 register; a multiple of AVX2's 8
QUERY_MULTIPLE = 8  # query rows: whole row blocks of the kernel's parallel tasks
PATTERN_NAME = "aotc.attention"


def _attention_pattern():
    q, kt, v, mask, scale = wildcard(), wildcard(), wildcard(), wildcard(), is_const()
    scores = is_op("relax.matmul")(q, kt)
    scaled = (is_op("relax.multiply")(scores, scale) | is_op("relax.multiply")(scale, scores)
              | is_op("relax.divide")(scores, scale) | scores)
    masked = is_op("relax.add")(scaled, mask) | is_op("relax.add")(mask, scaled) | scaled
    probs = is_op("relax.nn.softmax")(masked)
    out = is_op("relax.matmul")(probs, v)
    parts = {"q": q, "kt": kt, "v": v, "mask": mask, "scale": scale, "scores": scores,
             "scaled": scaled, "masked": masked, "probs": probs}
    return out, parts


_PART_NAMES = tuple(_attention_pattern()[1])


def _float32(expr) -> bool:
    return str(getattr(expr.ty, "dtype", "")) == "float32"


def _broadcasts_to(shape: list[int], target: list[int]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def _fits(m: dict) -> bool:
    """The chain can become one attention kernel (see the module docstring)."""
    q, kt, v, out = m["q"], m["kt"], m["v"], m["out"]
    shapes = [static_shape(e) for e in (q, kt, v, out)]
    if any(s is None for s in shapes) or not all(_float32(e) for e in (q, kt, v, out)):
        return False
    sq, skt, sv, _ = shapes
    if not (len(sq) == len(skt) == len(sv) >= 2 and sq[:-2] == skt[:-2] == sv[:-2]):
        return False
    if sq[-1] != skt[-2] or skt[-1] != sv[-2]:
        return False
    axis = int(m["probs"].attrs.axis)
    if axis not in (-1, len(sq) - 1):
        return False
    if "scale" in m and int(np.prod(m["scale"].value.numpy().shape)) != 1:
        return False
    if "mask" in m:
        mask_shape = static_shape(m["mask"])
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

def _pad_last(x: relax.Expr, axis_from_end: int, amount: int, rank: int | None = None
              ) -> relax.Expr:
    """Zeros after the end of axis ``-axis_from_end`` (``rank`` for not yet typed ``x``)."""
    rank = rank if rank is not None else len(static_shape(x))
    widths = [0] * (2 * rank)
    widths[2 * (rank - axis_from_end) + 1] = amount
    return relax.op.nn.pad(x, widths)


def _padded_chain(m: dict) -> relax.Expr | None:
    queries, keys = static_shape(m["q"])[-2], static_shape(m["kt"])[-1]
    pad_keys, pad_rows = -keys % KEY_MULTIPLE, -queries % QUERY_MULTIPLE
    if pad_keys == 0 and pad_rows == 0:
        return None
    q = _pad_last(m["q"], 2, pad_rows) if pad_rows else m["q"]
    kt = _pad_last(m["kt"], 1, pad_keys) if pad_keys else m["kt"]
    v = _pad_last(m["v"], 2, pad_keys) if pad_keys else m["v"]
    scores = relax.op.matmul(q, kt)
    if "scale" in m:
        op = m["scaled"].op.name
        scores = (relax.op.divide(scores, m["scale"]) if op == "relax.divide"
                  else relax.op.multiply(scores, m["scale"]))
    # One mask (the model's, if any, plus the padded keys' lowest float): the fused chain has
    # one add, and a constant mask folds at compile time.
    mask = None
    if pad_keys:
        lowest = np.zeros(keys + pad_keys, dtype="float32")
        lowest[keys:] = np.finfo(np.float32).min
        mask = relax.const(lowest)
    if "mask" in m:
        user = m["mask"]
        shape = static_shape(user)
        if shape[-1] == keys and pad_keys:
            user = _pad_last(user, 1, pad_keys, len(shape))
        if len(shape) >= 2 and shape[-2] == queries and pad_rows:
            user = _pad_last(user, 2, pad_rows, len(shape))
        mask = user if mask is None else relax.op.add(user, mask)
    if mask is not None:
        scores = relax.op.add(scores, mask)
    probs = relax.op.nn.softmax(scores, axis=-1)
    out = relax.op.matmul(probs, v)
    if pad_rows:
        rank = len(static_shape(m["q"]))
        out = relax.op.strided_slice(out, axes=[rank - 2], begin=[0], end=[queries])
    return out


def _intermediates_single_use(m: dict, single_use: set) -> bool:
    """Scores and probabilities read only by the chain itself (else fusing would compute
    them twice)."""
    return all(m[n] in single_use for n in ("scores", "scaled", "masked", "probs") if n in m)


def _padding_rewriter(parts: dict, single_use: set):
    def rewrite(expr, matchings):
        m = _matched(parts, matchings, expr)
        if not _fits(m) or not _intermediates_single_use(m, single_use):
            return expr
        padded = _padded_chain(m)
        return expr if padded is None else padded
    return rewrite


# --- step 2: group the chain ---------------------------------------------------------------

def _group_check(context) -> bool:
    m = {name: context.annotated_expr[name] for name in _PART_NAMES
         if name in context.annotated_expr}
    m["out"] = context.matched_expr
    if not _fits(m) or static_shape(m["kt"])[-1] % KEY_MULTIPLE:
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
        mod = rewrite_module(mod, pattern, _padding_rewriter(parts, single_use_values(mod)))
        mod = relax.transform.FoldConstant()(mod)  # padded constant masks
        return relax.transform.FuseOpsByPattern([attention_fusion_pattern()],
                                                bind_constants=False)(mod)
