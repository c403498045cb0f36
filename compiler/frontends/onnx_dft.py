"""ONNX DFT as matrix products with constant DFT matrices (TVM 0.27 has no converter).

The signal axis is moved last, each of the real and imaginary parts is multiplied by the
cos/sin matrices (built in float64 at compile time, then cast), and the parts are stacked
again. Covers forward and inverse transforms, onesided output (rfft) and onesided inverse
input (irfft, Hermitian weights as numpy's irfft), dft_length truncating or zero-padding. A
run-time axis (DFT-20 takes it as an input) computes every candidate axis and selects; that
needs all candidates to give one output shape, else it is refused by name. O(N^2) per signal:
meant for the short transforms of feature front-ends, not for long FFTs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from aotc.errors import UnsupportedModelError

from .onnx_graph import GraphInfo, node_attrs


class _Emit:
    def __init__(self, info: GraphInfo):
        self.info, self.nodes = info, []

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.info.fresh(f"dft_{op_type.lower()}")
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def const(self, value, dtype) -> str:
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(value, dtype)))


def dft(node: onnx.NodeProto, info: GraphInfo):
    x = node.input[0]
    shape = info.shape(x)
    if not shape or None in shape:
        raise UnsupportedModelError(f"DFT node {node.name!r}: the input shape must be known "
                                    "at compile time (fix it with --input-shape)")
    attrs = node_attrs(node)
    rank = len(shape)
    length = _constant_scalar(node, info, 1, "dft_length")
    candidates = _axes(node, info, attrs, rank)
    elem = info.elem_type(x) or TensorProto.FLOAT
    dtype = np.float64  # computed in double: float32 sums left 4e-6 where the answer is 0
    em = _Emit(info)
    wide = em.op("Cast", [x], to=TensorProto.DOUBLE)
    parts = [em.op("Squeeze", [em.op("Slice", [wide, em.const([c], np.int64),
                                              em.const([c + 1], np.int64),
                                              em.const([-1], np.int64)]),
                               em.const([-1], np.int64)])
             for c in range(shape[-1])]
    results, shapes = [], set()
    for axis in candidates:
        out, out_shape = _along(em, parts, shape, axis, length, attrs, dtype)
        results.append((axis, out))
        shapes.add(tuple(out_shape))
    if len(shapes) != 1:
        raise UnsupportedModelError(
            f"DFT node {node.name!r}: the axis is a run-time input and the candidate axes give "
            f"different output shapes {sorted(shapes)}; make the axis a constant")
    if len(results) == 1:
        em.op("Cast", [results[0][1]], node.output[0], to=elem)
        return em.nodes
    chosen = em.op("Gather", [em.const(np.arange(rank), np.int64),
                              em.op("Cast", [node.input[2]], to=TensorProto.INT64)], axis=0)
    selected = results[0][1]
    for axis, out in results[1:]:
        hit = em.op("Equal", [chosen, em.const(axis, np.int64)])
        selected = em.op("Where", [hit, out, selected])
    em.op("Cast", [selected], node.output[0], to=elem)
    return em.nodes


def _constant_scalar(node, info, k: int, what: str):
    if len(node.input) <= k or not node.input[k]:
        return None
    if node.input[k] not in info.constants:
        raise UnsupportedModelError(f"DFT node {node.name!r}: {what} must be a constant")
    return int(np.asarray(info.constants[node.input[k]]).reshape(-1)[0])


def _axes(node, info, attrs, rank: int) -> list[int]:
    """The signal axis (one), or every valid one when it is a run-time input."""
    if info.opset < 20:
        return [attrs.get("axis", 1) % rank]
    if len(node.input) <= 2 or not node.input[2]:
        return [rank - 2]
    if node.input[2] in info.constants:
        return [int(np.asarray(info.constants[node.input[2]]).reshape(-1)[0]) % rank]
    return list(range(rank - 1))


def _along(em: _Emit, parts, shape, axis: int, length, attrs, dtype):
    """(output name, output shape) of the transform along ``axis``."""
    rank = len(shape)
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    n_in = shape[axis]
    irfft = inverse and onesided
    total = length or (2 * (n_in - 1) if irfft else n_in)
    perm = [d for d in range(rank - 1) if d != axis] + [axis]
    back = list(np.argsort(perm))
    moved = [em.op("Transpose", [p], perm=perm) for p in parts]
    if irfft:
        real = _irfft(em, moved, n_in, total, dtype)
        outs = [real]
    else:
        n_out = total // 2 + 1 if onesided else total
        outs = _complex(em, moved, n_in, total, n_out, inverse, dtype)
    stacked = [em.op("Unsqueeze", [em.op("Transpose", [o], perm=back),
                                   em.const([-1], np.int64)]) for o in outs]
    out = stacked[0] if len(stacked) == 1 else em.op("Concat", stacked, axis=-1)
    out_shape = list(shape)
    out_shape[axis] = total if irfft else (total // 2 + 1 if onesided else total)
    out_shape[-1] = len(outs)
    return out, out_shape


def _complex(em, moved, n_in, total, n_out, inverse, dtype):
    used = min(n_in, total)  # samples past dft_length are dropped, missing ones are zeros
    k = np.arange(n_out)[:, None]
    n = np.arange(used)[None, :]
    angle = 2 * np.pi * k * n / total
    sign, scale = (1.0, 1.0 / total) if inverse else (-1.0, 1.0)
    cos_t = em.const((np.cos(angle) * scale).T, dtype)
    sin_t = em.const((sign * np.sin(angle) * scale).T, dtype)
    re = _first(em, moved[0], used, n_in)
    re_c, re_s = em.op("MatMul", [re, cos_t]), em.op("MatMul", [re, sin_t])
    if len(moved) == 1:
        return [re_c, re_s]
    im = _first(em, moved[1], used, n_in)
    im_c, im_s = em.op("MatMul", [im, cos_t]), em.op("MatMul", [im, sin_t])
    return [em.op("Sub", [re_c, im_s]), em.op("Add", [re_s, im_c])]


def _irfft(em, moved, n_in, total, dtype):
    """Real signal of ``total`` samples from ``n_in`` onesided bins (numpy's irfft)."""
    used = min(n_in, total // 2 + 1)
    k = np.arange(used)[:, None]
    n = np.arange(total)[None, :]
    nyquist = (k == total // 2) if total % 2 == 0 else np.zeros_like(k, bool)
    weight = np.where((k == 0) | nyquist, 1.0, 2.0) / total
    angle = 2 * np.pi * k * n / total
    re = em.op("MatMul", [_first(em, moved[0], used, n_in),
                          em.const(weight * np.cos(angle), dtype)])
    if len(moved) == 1:
        return re
    im = em.op("MatMul", [_first(em, moved[1], used, n_in),
                          em.const(-weight * np.sin(angle), dtype)])
    return em.op("Add", [re, im])


def _first(em, x: str, used: int, n_in: int) -> str:
    if used == n_in:
        return x
    return em.op("Slice", [x, em.const([0], np.int64), em.const([used], np.int64),
                           em.const([-1], np.int64)])
