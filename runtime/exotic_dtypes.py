"""Tensors of a type DLPack-from-numpy cannot carry: bfloat16.

numpy holds them through ml_dtypes, but numpy's DLPack export refuses them ("DLPack only
supports signed/unsigned integers, float and complex dtypes"), so a model with a bfloat16
input or output could not be run. They cross as same-width unsigned integers and are
re-labelled on the other side with TVM's tensor view (no copy). ml_dtypes is imported only
when such a tensor appears.

float8 is deliberately not passed through: with it, 24 node-suite casts from float8 ran and
gave wrong values (TVM 0.27's float8 conversions); it stays a loud error until they are right."""

from __future__ import annotations

import numpy as np

from aotc.errors import InputMismatchError, ModelRunError

# TVM dtype name -> bits of the unsigned type it crosses as.
EXOTIC = {"bfloat16": 16}


def to_tvm(ffi, array: np.ndarray):
    """A TVM tensor for ``array`` (a view of the same memory)."""
    name = array.dtype.name
    if name not in EXOTIC:
        try:
            return ffi.from_dlpack(array)
        except BufferError:
            raise InputMismatchError(f"an input of dtype {name} cannot be passed to the TVM "
                                     "runtime (no DLPack type; float8 is not supported)") from None
    raw = ffi.from_dlpack(array.view(f"uint{EXOTIC[name]}"))
    return _view(ffi)(raw, tuple(array.shape), name, 0)


def to_numpy(ffi, tensor) -> np.ndarray:
    """A numpy array for a TVM output tensor."""
    name = str(tensor.dtype)
    if name not in EXOTIC:
        try:
            return np.from_dlpack(tensor)
        except (BufferError, RuntimeError, TypeError):
            raise ModelRunError(f"an output of dtype {name} cannot be handed to numpy "
                                "(float8 and sub-byte types are not supported)") from None
    import ml_dtypes  # pylint: disable=import-outside-toplevel
    raw = _view(ffi)(tensor, tuple(tensor.shape), f"uint{EXOTIC[name]}", 0)
    return np.from_dlpack(raw).view(getattr(ml_dtypes, name))


def _view(ffi):
    return ffi.get_global_func("runtime.TVMTensorCreateView")
