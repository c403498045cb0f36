"""The int8 kernels realize emits, scheduled by Int8Dot, against numpy's integer arithmetic:
channel counts that do not fill a 16x4 block (3 -> 24), stride, dilation, padding (filled with
the zero point), a matmul with leading axes; the code uses vpdpbusd. On a target without VNNI
the rule declines (Contraction schedules the kernel as plain integer loops)."""

import numpy as np
import pytest
import tvm
from tvm import te

from aotc.compiler.lower.cpu_int8 import Int8Dot, tile_shape
from aotc.compiler.quantize import int8_kernels as k

VNNI = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})
RNG = np.random.default_rng(0)


def _build(out, inputs, target=VNNI):
    func = te.create_prim_func([*inputs, out])
    with target:
        sch = Int8Dot().apply(func, target, False)
    assert sch is not None
    return tvm.compile(sch.mod, target=target)


def _conv_reference(x, w, zero, stride, pad, dilation):
    xp = np.pad(x.astype(np.int64), ((0, 0), (pad, pad), (pad, pad), (0, 0)),
                constant_values=zero)
    kh, kw, _, oc = w.shape
    oh = (xp.shape[1] - (kh - 1) * dilation - 1) // stride + 1
    ow = (xp.shape[2] - (kw - 1) * dilation - 1) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, oc), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i * dilation:i * dilation + oh * stride:stride,
                       j * dilation:j * dilation + ow * stride:stride, :]
            out += patch @ w[i, j].astype(np.int64)
    return out


@pytest.mark.parametrize("ic,oc,stride,pad,dilation", [(3, 24, 2, 1, 1), (32, 64, 1, 2, 2),
                                                        (16, 16, 1, 0, 1)])
def test_conv2d_matches_integer_reference(ic, oc, stride, pad, dilation):
    x = RNG.integers(0, 256, (1, 11, 9, ic)).astype(np.uint8)
    w = RNG.integers(-127, 128, (3, 3, ic, oc)).astype(np.int8)
    zero = 7
    xt = te.placeholder(x.shape, "uint8", "x")
    packed = k.pack_conv_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    out = k.conv2d_nhwc(xt, wt, oc, (stride, stride), (pad, pad, pad, pad),
                        (dilation, dilation), zero)
    lib = _build(out, [xt, wt])
    want = _conv_reference(x, w, zero, stride, pad, dilation)
    got = tvm.runtime.tensor(np.zeros(want.shape, np.int32))
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    np.testing.assert_array_equal(got.numpy(), want)
    assert "vpdpbusd" in lib.mod.inspect_source("asm")


def test_matmul_with_leading_axes():
    x = RNG.integers(0, 256, (2, 5, 30)).astype(np.uint8)
    w = RNG.integers(-127, 128, (30, 20)).astype(np.int8)
    xt = te.placeholder(x.shape, "uint8", "x")
    packed = k.pack_matmul_weight(w)
    wt = te.placeholder(packed.shape, "int8", "w")
    lib = _build(k.matmul(xt, wt, 20, 3), [xt, wt])
    got = tvm.runtime.tensor(np.zeros((2, 5, 20), np.int32))
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(packed), got)
    xp = np.concatenate([x, np.full((2, 5, 2), 3, np.uint8)], -1).astype(np.int64)
    wp = np.concatenate([w, np.zeros((2, 20), np.int8)]).astype(np.int64)
    np.testing.assert_array_equal(got.numpy(), xp @ wp)


def test_no_vnni_declines():
    xt = te.placeholder((1, 4, 4, 16), "uint8", "x")
    wt = te.placeholder((1, 1, 1, 4, 16, 4), "int8", "w")
    func = te.create_prim_func([xt, wt, k.conv2d_nhwc(xt, wt, 16, (1, 1), (0, 0, 0, 0),
                                                      (1, 1), 0)])
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    assert Int8Dot().apply(func, avx512, False) is None


def test_tile_shape_fits_registers():
    for blocks in (1, 2, 3, 4, 8, 24):
        for rows in (1, 7, 14, 56, 128, 197):
            r, v = tile_shape(blocks, rows)
            assert blocks % v == 0 and rows % r == 0 and r * v <= 24
