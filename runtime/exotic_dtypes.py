"""Tensors of types DLPack-from-numpy cannot carry: bfloat16, 4-/2-bit integers, float8, float4.

numpy holds them through ml_dtypes, but numpy's DLPack export refuses them ("DLPack only
supports signed/unsigned integers, float and complex dtypes"), and TVM cannot hold the narrow
ones at all. So:
  - bfloat16 crosses as uint16 and is re-labelled on the other side with TVM's tensor view
    (no copy);
  - int4/uint4/int2/uint2 cross as int8/uint8 values, float8/float4 as uint8 bit codes: the
    compiled model computes on those bytes (compiler/frontends/onnx_lowbit.py), and outputs
    are turned back into the dtype the signature names.
ml_dtypes is imported only when such a tensor appears. float8_e8m0fnu has no conversion yet
and stays a named error."""

from __future__ import annotations

import numpy as np

from aotc.errors import InputMismatchError, ModelRunError

from .buffers import aligned_empty

# TVM dtype name -> bits of the unsigned type it crosses as (a view, same memory).
VIEWED = {"bfloat16": 16}
# numpy (ml_dtypes) dtype name -> byte dtype the compiled model holds it in.
NARROW_VALUES = {"int4": "int8", "uint4": "uint8", "int2": "int8", "uint2": "uint8"}
NARROW_CODES = {name: "uint8" for name in (
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn")}


# dtypes DLPack carries as they are: the common case, checked by dtype (a set lookup) because
# ``dtype.name`` is computed in Python, microseconds a call, which a small model's run notices.
_PLAIN = frozenset(np.dtype(n) for n in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64"))
_PLAIN_NAMES = frozenset(d.name for d in _PLAIN)


def carried_dtype(name: str) -> str:
    """The dtype the compiled model takes for a tensor the user holds as ``name``."""
    return NARROW_VALUES.get(name) or NARROW_CODES.get(name) or name


def to_tvm(ffi, array: np.ndarray):
    """A TVM tensor for ``array`` (a view of the same memory, or a byte copy when narrow)."""
    if array.dtype in _PLAIN:
        return ffi.from_dlpack(array)
    name = array.dtype.name
    if name in NARROW_VALUES:  # a copy of aotc's own: aligned as the kernels need (buffers.py)
        values = aligned_empty(array.shape, NARROW_VALUES[name])
        values[...] = array
        return ffi.from_dlpack(values)
    if name in NARROW_CODES:
        return ffi.from_dlpack(np.ascontiguousarray(array).view(np.uint8))
    if name not in VIEWED:
        try:
            return ffi.from_dlpack(array)
        except BufferError:
            raise InputMismatchError(f"an input of dtype {name} cannot be passed to the TVM "
                                     "runtime (no DLPack type, no aotc conversion)") from None
    raw = ffi.from_dlpack(array.view(f"uint{VIEWED[name]}"))
    return _view(ffi)(raw, tuple(array.shape), name, 0)


def to_numpy(ffi, tensor, want: str | None = None) -> np.ndarray:
    """A numpy array for a TVM output tensor; ``want`` is the signature's dtype for it."""
    if want in _PLAIN_NAMES:
        try:
            return np.from_dlpack(tensor)
        except (BufferError, RuntimeError, TypeError):
            pass  # not the dtype the signature says: the checks below name it
    name = str(tensor.dtype)
    if want in NARROW_VALUES or want in NARROW_CODES:
        import ml_dtypes
        stored = np.from_dlpack(tensor)
        if want in NARROW_VALUES:
            return stored.astype(getattr(ml_dtypes, want))
        return stored.view(getattr(ml_dtypes, want))
    if name not in VIEWED:
        try:
            return np.from_dlpack(tensor)
        except (BufferError, RuntimeError, TypeError):
            raise ModelRunError(f"an output of dtype {name} cannot be handed to numpy "
                                "(no DLPack type, no aotc conversion)") from None
    import ml_dtypes
    raw = _view(ffi)(tensor, tuple(tensor.shape), f"uint{VIEWED[name]}", 0)
    return np.from_dlpack(raw).view(getattr(ml_dtypes, name))


def _view(ffi):
    return ffi.get_global_func("runtime.TVMTensorCreateView")
