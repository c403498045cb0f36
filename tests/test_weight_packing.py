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


def test_odd_block_counts_get_one_block_more_for_prepacked_kernels():
    """With whole_tiles (PrepackWeights), a count of 16 or more blocks with no divisor from 2
    to 4 gets one zero block more, so that the register tile can take two blocks a step:
    GPT-2's 50,257-word head is 6,283 = 61 x 103 blocks of 8 (AVX2), 3,142 of 16 (even)."""
    assert k.packed_blocks(50257, 8, whole_tiles=True) == 6284
    assert k.packed_blocks(50257, 8) == 6283
    assert k.packed_blocks(50257, 16, whole_tiles=True) == 3142
    assert k.packed_blocks(8 * 13, 8, whole_tiles=True) == 13  # under 16 blocks: 1/13 more
    assert k.packed_blocks(8 * 27, 8, whole_tiles=True) == 27  # 3 divides it
    fmt = k.fp32_format(8)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((7, 8 * 17 - 3)).astype(np.float32)
    shape = k.matmul_packed_shape(w.shape, fmt, whole_tiles=True)
    assert shape[0] == 18
    packed = k.packed_tensor(k.pack_matmul_weight, w, fmt, shape).numpy()
    np.testing.assert_array_equal(packed[:17], _matmul_reference(w, fmt))
    assert not packed[17].any()
    conv = rng.standard_normal((3, 3, 5, 8 * 17)).astype(np.float32)
    shape = k.conv_packed_shape(conv.shape, fmt, whole_tiles=True)
    packed = k.packed_tensor(k.pack_conv_weight, conv, fmt, shape).numpy()
    np.testing.assert_array_equal(packed[:17], _conv_reference(conv, fmt))
    assert not packed[17].any()


def test_block_counts_follow_the_register_tile_the_kernel_takes():
    """Given the merit of the tile PrepackWeights' kernel takes (cpu_dot.
    packed_matmul_tile_merit), the count of blocks up to 1/16 more with the most tile merit
    per real column. AVX-512 (32 registers), 128 rows, K = 768: GPT-2's head (3,142 = 2 x
    1,571 blocks of 16) took 8x2 tiles and gets 3,144 (8x3); 1,024 columns (64 blocks: 8x2 or
    4x4) get 66; 3,072 (192 = 3 x 64) keep theirs. AVX2 (16 registers, the broadcast in one)
    keeps 6,284 blocks of 8 for the head, whose two-block tiles are its best. Without whole
    tiles nothing is padded; on a tie the fewest blocks."""
    from aotc.compiler.default_schedules.cpu_dot import packed_matmul_tile_merit
    avx512 = packed_matmul_tile_merit(128, 768, 32, broadcast_register=False)
    assert k.packed_blocks(50257, 16, True, avx512) == 3144
    assert k.packed_blocks(1024, 16, True, avx512) == 66
    assert k.packed_blocks(3072, 16, True, avx512) == 192
    assert k.packed_blocks(1024, 16, False, avx512) == 64
    assert k.packed_blocks(50257, 16, True, lambda blocks: 1.0) == 3142
    avx2 = packed_matmul_tile_merit(128, 768, 16, broadcast_register=True)
    assert k.packed_blocks(50257, 8, True, avx2) == 6284
