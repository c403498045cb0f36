"""64-byte-aligned numpy buffers for tensors handed to compiled kernels."""

from __future__ import annotations

import numpy as np

# TVM compiles kernels assuming every tensor argument is 64-byte aligned (it emits aligned AVX-512
# loads); numpy only guarantees 16. An unaligned input segfaulted intermittently (SqueezeNet's
# first conv, BERT's embedding) depending on where malloc put the array.
TVM_ALIGNMENT = 64


def aligned(array: np.ndarray) -> np.ndarray:
    """``array`` itself if 64-byte aligned (or empty: nothing is read), else an aligned copy."""
    if array.size == 0 or array.ctypes.data % TVM_ALIGNMENT == 0:
        return array
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data is 64-byte aligned."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + TVM_ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % TVM_ALIGNMENT
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)
