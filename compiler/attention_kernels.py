"""The bf16 attention kernel of ``--precision bf16`` (quantize/bf16_attention.py): the two
products of ``softmax(Q @ Kt * scale + mask) @ V`` as bfloat16 dot products with float32 sums
(AVX512-BF16's ``vdpbf16ps``, as the packed contractions of dot_kernels.py), the softmax in
float32.

Operands travel as bfloat16 bits (uint16), packed by their own kernels, which FuseOps merges
into the head-split transposes that produce them:
- ``qb`` [..., S, D]: Q's rows; each step of the score sum broadcasts one pair of them;
- ``kp`` [..., Sk/16, D/2, 16, 2]: Kt as a packed matmul weight (16 keys x 2 head-dim values a
  block), the score tile's right operand;
- ``vp`` [..., D/16, Sk/2, 16, 2]: V packed the same way, 16 head-dim values x 2 keys.
The probabilities are rounded to bfloat16 in the kernel, row block by row block
(compiler/default_schedules/cpu_attention.py).

The head dim must be a multiple of 16 and the key count of 16 (FuseAttention pads the keys);
the reduction blocks are named SCORES_BLOCK and OUTPUT_BLOCK, by which the schedule knows the
kernel."""

from __future__ import annotations

from tvm import te, tirx, topi

from .default_schedules.vector_math import softmax_exp
from .dot_kernels import BF16, bf16_rounded_bits, bf16_value

SCORES_BLOCK = "aotc_bf16_attention_scores"
OUTPUT_BLOCK = "aotc_bf16_attention_out"
PACK_BLOCKS = ("aotc_pack_keys", "aotc_pack_values")
LANES, GROUP = BF16.lanes, BF16.group


def pack_keys(kt: te.Tensor) -> te.Tensor:
    """Kt [..., D, Sk] float32 -> bfloat16 bits [..., Sk/16, D/2, 16, 2]."""
    *lead, d, keys = kt.shape
    shape = [*lead, keys // LANES, d // GROUP, LANES, GROUP]
    return te.compute(shape, lambda *i: bf16_rounded_bits(
        kt(*i[:-4], i[-3] * GROUP + i[-1], i[-4] * LANES + i[-2])), name=PACK_BLOCKS[0])


def pack_values(v: te.Tensor) -> te.Tensor:
    """V [..., Sk, D] float32 -> bfloat16 bits [..., D/16, Sk/2, 16, 2]."""
    *lead, keys, d = v.shape
    shape = [*lead, d // LANES, keys // GROUP, LANES, GROUP]
    return te.compute(shape, lambda *i: bf16_rounded_bits(
        v(*i[:-4], i[-3] * GROUP + i[-1], i[-4] * LANES + i[-2])), name=PACK_BLOCKS[1])


def attention(qb: te.Tensor, kp: te.Tensor, vp: te.Tensor, mask: te.Tensor | None,
              scale: float | None, divide: bool, nan_value: float | None) -> te.Tensor:
    """float32 [..., S, V's head dim] from the packed operands. ``scale`` multiplies the
    scores (divides them with ``divide``), ``mask`` (broadcast to the scores) is added,
    ``nan_value`` replaces NaN probabilities (torch's safe softmax)."""
    *lead, rows, depth = qb.shape
    keys = kp.shape[-4] * LANES
    width = vp.shape[-4] * LANES  # V's head dim: Q's may differ
    n = len(lead)
    rd = te.reduce_axis((0, depth), "rd")
    scores = te.compute([*lead, rows, keys], lambda *i: te.sum(
        bf16_value(qb(*i[:n], i[n], rd)) *
        bf16_value(kp(*i[:n], i[n + 1] // LANES, rd // GROUP, i[n + 1] % LANES, rd % GROUP)),
        axis=[rd]), name=SCORES_BLOCK)

    def adjusted(*i):
        s = scores(*i)
        if scale is not None:
            c = tirx.const(scale, "float32")
            s = s / c if divide else s * c
        if mask is not None:
            s = s + mask(*_broadcast_index(i, mask.shape))
        return s
    masked = te.compute(scores.shape, adjusted, name="masked")
    top = topi.max(masked, axis=-1, keepdims=True)
    shifted = te.compute(masked.shape, lambda *i: masked(*i) - top(*i[:-1], 0), name="shifted")
    exp = softmax_exp(shifted)
    total = topi.sum(exp, axis=-1, keepdims=True)
    # one division a row, then multiplies: a vector division costs several multiplies, and the
    # extra rounding (2^-24) is far below the bf16 rounding of the probabilities that follows
    inverse = te.compute(total.shape, lambda *i: tirx.const(1.0, "float32") / total(*i),
                         name="inverse")

    def probability(*i):
        p = exp(*i) * inverse(*i[:-1], 0)
        if nan_value is not None:
            p = tirx.Select(tirx.isnan(p), tirx.const(nan_value, "float32"), p)
        return bf16_rounded_bits(p)
    probs = te.compute(masked.shape, probability, name="aotc_bf16_probs")
    rk = te.reduce_axis((0, keys), "rk")
    return te.compute([*lead, rows, width], lambda *i: te.sum(
        bf16_value(probs(*i[:n], i[n], rk)) *
        bf16_value(vp(*i[:n], i[n + 1] // LANES, rk // GROUP, i[n + 1] % LANES, rk % GROUP)),
        axis=[rk]), name=OUTPUT_BLOCK)


def _broadcast_index(index: tuple, shape) -> tuple:
    """``index`` into a tensor of ``shape`` broadcast to the index's rank (size-1 dims read 0)."""
    index = index[len(index) - len(shape):]
    return tuple(0 if isinstance(d, tirx.IntImm) and int(d) == 1 else i
                 for i, d in zip(index, shape))
