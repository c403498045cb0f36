"""The int8 contractions realize emits: conv2d (NHWC) and matmul with u8 activations, s8
weights prepacked at compile time, and int32 accumulation.

Why this form: x86's VNNI ``vpdpbusd`` multiplies 4 consecutive u8 activations by 4 s8 weights
for each of 16 output channels and adds them into 16 int32 lanes. So the weights are packed
``[OC/16, ..., IC/4, 16, 4]``: the 16x4 block the instruction reads is contiguous, and the
schedule (compiler/lower/cpu_int8.py) tensorizes the two innermost loops onto it. Channels that
do not fill a block are padded: weights with zeros, activations with their zero point (so that
the zero-point correction, computed over the real weights, stays exact). Spatial padding is
the activation's zero point too, which is the quantized value of 0.0.

The reduction block is named INT8_BLOCK: the schedule rule recognizes the kernel by it."""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

INT8_BLOCK = "aotc_int8_contract"
PAD_BLOCK = "aotc_int8_pad"
LANES, GROUP = 16, 4  # output channels per block x inputs per int32 lane (vpdpbusd)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def pack_conv_weight(weight_hwio: np.ndarray) -> np.ndarray:
    """int8 HWIO -> [OC/16, KH, KW, IC/4, 16, 4], zero-padded to whole blocks."""
    kh, kw, ic, oc = weight_hwio.shape
    icp, ocp = _round_up(ic, GROUP), _round_up(oc, LANES)
    padded = np.zeros((kh, kw, icp, ocp), np.int8)
    padded[:, :, :ic, :oc] = weight_hwio
    blocks = padded.reshape(kh, kw, icp // GROUP, GROUP, ocp // LANES, LANES)
    return np.ascontiguousarray(blocks.transpose(4, 0, 1, 2, 5, 3))


def pack_matmul_weight(weight_kn: np.ndarray) -> np.ndarray:
    """int8 [K, N] -> [N/16, K/4, 16, 4], zero-padded to whole blocks."""
    k, n = weight_kn.shape
    kp, np_ = _round_up(k, GROUP), _round_up(n, LANES)
    padded = np.zeros((kp, np_), np.int8)
    padded[:k, :n] = weight_kn
    blocks = padded.reshape(kp // GROUP, GROUP, np_ // LANES, LANES)
    return np.ascontiguousarray(blocks.transpose(2, 0, 3, 1))


def _crop(acc: te.Tensor, channels: int) -> te.Tensor:
    if int(acc.shape[-1]) == channels:
        return acc
    shape = list(acc.shape[:-1]) + [channels]
    return te.compute(shape, lambda *i: acc(*i), name="aotc_int8_crop")


def conv2d_nhwc(x: te.Tensor, w: te.Tensor, out_channels: int, strides, padding, dilation,
                zero_point: int) -> te.Tensor:
    """int32 conv2d of u8 NHWC ``x`` and packed s8 ``w``; ``padding`` is (top, left, bottom,
    right)."""
    n, h, width, c = (int(d) for d in x.shape)
    ocb, kh, kw, icb = (int(d) for d in w.shape[:4])
    icp = icb * GROUP
    top, left, bottom, right = padding
    (sh, sw), (dh, dw) = strides, dilation
    if any(padding) or icp != c:
        def padded(b, i, j, k):
            inside = tirx.all(i >= top, i < h + top, j >= left, j < width + left, k < c)
            return tirx.if_then_else(inside, x[b, i - top, j - left, k],
                                     tirx.const(zero_point, "uint8"))
        x = te.compute((n, h + top + bottom, width + left + right, icp), padded, name=PAD_BLOCK)
    oh = (int(x.shape[1]) - (kh - 1) * dh - 1) // sh + 1
    ow = (int(x.shape[2]) - (kw - 1) * dw - 1) // sw + 1
    rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")
    rc = te.reduce_axis((0, icp), "rc")
    acc = te.compute((n, oh, ow, ocb * LANES), lambda b, i, j, o: te.sum(
        x[b, i * sh + rh * dh, j * sw + rw * dw, rc].astype("int32")
        * w[o // LANES, rh, rw, rc // GROUP, o % LANES, rc % GROUP].astype("int32"),
        axis=[rh, rw, rc]), name=INT8_BLOCK)
    return _crop(acc, out_channels)


def matmul(x: te.Tensor, w: te.Tensor, out_features: int, zero_point: int) -> te.Tensor:
    """int32 ``x @ W`` of u8 ``x`` [..., M, K] and packed s8 ``w`` [N/16, K/4, 16, 4]."""
    k = int(x.shape[-1])
    kp = int(w.shape[1]) * GROUP
    lead = list(x.shape[:-1])
    if kp != k:
        x = te.compute(lead + [kp], lambda *i: tirx.if_then_else(
            i[-1] < k, x(*i), tirx.const(zero_point, "uint8")), name=PAD_BLOCK)
    rk = te.reduce_axis((0, kp), "rk")
    acc = te.compute(lead + [int(w.shape[0]) * LANES], lambda *i: te.sum(
        x(*i[:-1], rk).astype("int32")
        * w[i[-1] // LANES, rk // GROUP, i[-1] % LANES, rk % GROUP].astype("int32"),
        axis=[rk]), name=INT8_BLOCK)
    return _crop(acc, out_features)
