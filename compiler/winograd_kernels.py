"""Winograd convolution kernels F(m x m, 3 x 3) for float32 NHWC 3x3 stride-1 convolutions:
an input transform, one batched matmul per transformed position, an output transform.

Why: a direct 3x3 conv does 9 multiply-adds per output value and input channel; F(4x4, 3x3)
does 36/16 = 2.25 (F(2x2, 3x3): 4), plus two transforms that read and write each value once
(timings against the packed direct kernel: docs/design/measurements.md#compilerwinograd_kernelspy).
The price is rounding: the transforms' constants
(up to 8 and 1/24) make float32 results differ from the direct sum by about 1e-5 relative
(max |diff| 3-6e-5 on outputs of magnitude 4 for m=4; 1e-5 for m=2).

Layouts: the transformed input is ``[E, P, C]`` (E = (m+2)^2 positions, P = batch x tiles),
the matmul's weights ``[E, OC/L, C, L, 1]`` (``dot_kernels``' packed float32 layout per
position, so ``PackedDot`` schedules it as it does every packed matmul), its product
``[E, P, OC]``. Each transform is two separable stages (rows, then columns), each a
``Select`` over its position index of one expression per position, written out here with the
zero coefficients left out: the schedule (compiler/default_schedules/cpu_winograd.py) unrolls that
index,
so each unrolled copy keeps only its own expression. One Select over all 36 positions of the
whole 2-D transform would take LLVM seconds per kernel to fold."""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

from . import dot_kernels

INPUT_BLOCK = "aotc_winograd_input"
OUTPUT_BLOCK = "aotc_winograd_output"
INPUT_ROWS_BLOCK = "aotc_winograd_input_rows"
OUTPUT_ROWS_BLOCK = "aotc_winograd_output_rows"

# (B^T, G, A^T) of F(m x m, 3 x 3), interpolation points 0, +-1, +-2 (Lavin and Gray, 2015)
MATRICES = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float),
        np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], float),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], float),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], float)),
}


def tiles(extent: int, m: int) -> int:
    return -(-extent // m)


def transform_weight(weight_hwio: np.ndarray, m: int, lanes: int,
                     fmt: dot_kernels.DotFormat | None = None) -> np.ndarray:
    """HWIO 3x3 float32 weights -> G g G^T per input/output channel (computed in float64),
    packed ``[E, OC/L, C, L, 1]`` in float32; with ``fmt`` BF16, each position's [C, OC]
    packed as a bf16 matmul weight, ``[E, OC/16, C/2, 16, 2]``."""
    _, g, _ = MATRICES[m]
    u = np.einsum("ai,ijco,bj->abco", g, weight_hwio.astype(np.float64), g)
    alpha = m + 2
    _, _, c, oc = weight_hwio.shape
    if fmt is dot_kernels.BF16:
        u = u.reshape(alpha * alpha, c, oc).astype(np.float32)
        return np.stack([dot_kernels.pack_matmul_weight(position, fmt) for position in u])
    u = u.reshape(alpha * alpha, c, oc // lanes, lanes, 1).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(u, np.float32)


def _combine(coefficients, values):
    """sum(c * v) with the zero terms left out and +-1 as add/subtract."""
    out = None
    for c, v in zip(coefficients, values):
        if c == 0:
            continue
        term = v if c == 1 else -v if c == -1 else v * tirx.const(float(c), "float32")
        out = term if out is None else out + term
    return out if out is not None else tirx.const(0.0, "float32")


def _row_times(matrix, index, values):
    """(matrix[index] . values) for a loop variable ``index``: a Select over the rows, each
    written out by _combine; the schedule unrolls ``index`` and the Select folds away."""
    exprs = [_combine(row, values) for row in matrix]
    out = exprs[-1]
    for k in range(len(exprs) - 2, -1, -1):
        out = tirx.Select(index == k, exprs[k], out)
    return out


def input_transform(x: te.Tensor, m: int, padding, bf16: bool = False) -> te.Tensor:
    """``[E, P, C]``: B^T d B of every (m+2)x(m+2) input tile d of NHWC ``x`` (tiles m apart;
    ``padding`` (top, left, bottom, right) and the last partial tile read zeros), in two
    separable stages: B^T d (``INPUT_ROWS_BLOCK``, [m+2, P, m+2, C]), then (B^T d) B, in
    float32, or with ``bf16`` its bfloat16 bits (the bf16 product's operand)."""
    n, height, width, channels = (int(d) for d in x.shape)
    top, left, bottom, right = padding
    alpha, bt = m + 2, MATRICES[m][0]
    th, tw = tiles(height + top + bottom - 2, m), tiles(width + left + right - 2, m)
    zero = tirx.const(0.0, "float32")

    def rows(r, p, j, c):
        b, t = p // (th * tw), p % (th * tw)
        h0, w = t // tw * m - top, t % tw * m - left + j

        def tap(i):
            h = h0 + i
            inside = tirx.all(h >= 0, h < height, w >= 0, w < width)
            return tirx.if_then_else(inside, x[b, h, w, c], zero)
        return _row_times(bt, r, [tap(i) for i in range(alpha)])
    t = te.compute((alpha, n * th * tw, alpha, channels), rows, name=INPUT_ROWS_BLOCK)

    def value(e, p, c):
        v = _row_times(bt, e % alpha, [t[e // alpha, p, j, c] for j in range(alpha)])
        return dot_kernels.bf16_rounded_bits(v) if bf16 else v
    return te.compute((alpha * alpha, n * th * tw, channels), value, name=INPUT_BLOCK)


def batched_matmul(v: te.Tensor, u: te.Tensor) -> te.Tensor:
    """``[E, P, OC]`` float32: v[e] @ U[e] for the packed ``u``, float32 ``[E, OC/L, C, L, 1]``
    or bf16 ``[E, OC/16, C/2, 16, 2]`` (``v`` then bfloat16 bits); named as dot_kernels'
    contraction of that format, so that PackedDot schedules it."""
    positions, rows, channels = (int(d) for d in v.shape)
    blocks, lanes = int(u.shape[1]), int(u.shape[3])
    rc = te.reduce_axis((0, channels), "rc")
    if str(u.dtype) == dot_kernels.BF16.weight:
        fmt, group = dot_kernels.BF16, dot_kernels.BF16.group
        return te.compute((positions, rows, blocks * lanes), lambda e, p, o: te.sum(fmt.product(
            v[e, p, rc], u[e, o // lanes, rc // group, o % lanes, rc % group]), axis=[rc]),
            name=fmt.block)
    fmt = dot_kernels.fp32_format(lanes)
    return te.compute((positions, rows, blocks * lanes), lambda e, p, o: te.sum(
        v[e, p, rc] * u[e, o // lanes, rc, o % lanes, 0], axis=[rc]), name=fmt.block)


def output_transform(product: te.Tensor, n: int, out_h: int, out_w: int, m: int) -> te.Tensor:
    """NHWC ``[n, out_h, out_w, OC]``: A^T M A of each tile's ``product`` values, the last
    partial tile cropped; in two stages, A^T M (``OUTPUT_ROWS_BLOCK``, [m, P, m+2, OC]), then
    (A^T M) A."""
    alpha, at = m + 2, MATRICES[m][2]
    th, tw = tiles(out_h, m), tiles(out_w, m)
    t = te.compute((m, int(product.shape[1]), alpha, int(product.shape[2])),
                   lambda i, p, s, c: _row_times(
                       at, i, [product[r * alpha + s, p, c] for r in range(alpha)]),
                   name=OUTPUT_ROWS_BLOCK)

    def value(b, h, w, c):
        p = (b * th + h // m) * tw + w // m
        return _row_times(at, w % m, [t[h % m, p, s, c] for s in range(alpha)])
    return te.compute((n, out_h, out_w, int(product.shape[-1])), value, name=OUTPUT_BLOCK)
