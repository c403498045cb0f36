"""Packed weights (compiler/dot_kernels.py) against their definition, element by element: a
matmul weight [K, N] becomes [N/L, K/G, L, G] with out[j, a, l, g] = w[a*G + g, j*L + l], a
conv weight HWIO becomes [OC/L, KH, KW, IC/G, L, G] likewise; zero where K/IC or N/OC are
padded to whole groups and lanes. Every format, odd sizes, and straight into a TVM tensor."""

import numpy as np
import pytest

from aotc.compiler import dot_kernels as k

FORMATS = [k.INT8, k.BF16, k.FP16, *k.FP32_FORMATS.values()]


def _weights(shape, fmt, rng):
    if fmt is k.INT8:
        return rng.integers(-128, 128, shape).astype(np.int8)
    return rng.standard_normal(shape).astype(np.float16 if fmt is k.FP16 else np.float32)


def _stored(w, fmt):
    return k.bf16_bits(w) if fmt is k.BF16 else w


def _matmul_reference(w, fmt):
    w = _stored(w, fmt)
    out = np.zeros(k.matmul_packed_shape(w.shape, fmt), fmt.weight)
    for (a, n), value in np.ndenumerate(w):
        out[n // fmt.lanes, a // fmt.group, n % fmt.lanes, a % fmt.group] = value
    return out


def _conv_reference(w, fmt):
    w = _stored(w, fmt)
    out = np.zeros(k.conv_packed_shape(w.shape, fmt), fmt.weight)
    for (h, x, c, o), value in np.ndenumerate(w):
        out[o // fmt.lanes, h, x, c // fmt.group, o % fmt.lanes, c % fmt.group] = value
    return out


CASES = ([(k.pack_matmul_weight, _matmul_reference, kn)
          for kn in [(1, 1), (7, 5), (13, 33), (64, 48)]]
         + [(k.pack_conv_weight, _conv_reference, hwio)
            for hwio in [(3, 3, 3, 16), (1, 1, 7, 5), (5, 5, 1, 24), (3, 2, 13, 33)]])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f"{f.weight}x{f.lanes}")
@pytest.mark.parametrize("pack, reference, shape", CASES,
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else None)
def test_weights_are_packed_as_defined(fmt, pack, reference, shape):
    w = _weights(shape, fmt, np.random.default_rng(sum(shape)))
    want = reference(w, fmt)
    np.testing.assert_array_equal(pack(w, fmt), want)
    tensor = k.packed_tensor(pack, w, fmt, want.shape)
    np.testing.assert_array_equal(tensor.numpy(), want)
