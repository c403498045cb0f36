"""Tensors of the Open Inference Protocol (KServe v2) and numpy arrays, both ways.

A request's inputs arrive as JSON data, as raw bytes (the binary tensor data extension over
HTTP, ``raw_input_contents`` over gRPC) or as typed gRPC contents; every form is checked
against the datatype and element count it declares before numpy sees it. The model's own
signature check (names, dtypes, shapes, dim ranges) follows in the batcher."""

from __future__ import annotations

import numpy as np

from aotc.errors import InputMismatchError

# OIP datatype <-> numpy dtype name. BYTES (strings) has no tensor in a compiled model.
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
             "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32",
             "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64"}
NUMPY_TO_DATATYPE = {v: k for k, v in DATATYPES.items()}
try:  # bfloat16 through ml_dtypes, which the runtime uses for it too
    import ml_dtypes
    DATATYPES["BF16"] = "bfloat16"
    NUMPY_TO_DATATYPE["bfloat16"] = "BF16"
    _EXTRA = {"bfloat16": np.dtype(ml_dtypes.bfloat16)}
except ImportError:  # pragma: no cover - ml_dtypes is a dependency of the runtime
    _EXTRA = {}


class BadRequest(InputMismatchError):
    """The request itself is malformed (answered 400, like a signature mismatch)."""


class PayloadTooLarge(BadRequest):
    """The request body is over the server's limit (answered 413)."""


def numpy_dtype(datatype: str, name: str) -> np.dtype:
    if datatype not in DATATYPES:
        raise BadRequest(f"input {name!r}: datatype {datatype!r} is not one of "
                         f"{sorted(DATATYPES)}")
    dtype = DATATYPES[datatype]
    return _EXTRA.get(dtype) or np.dtype(dtype)


def datatype_of(dtype_name: str) -> str:
    """The OIP datatype of a signature dtype (a model's tensors are always one of them)."""
    return NUMPY_TO_DATATYPE.get(dtype_name, dtype_name.upper())


def checked_shape(shape, name: str) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: shape must be a list of sizes >= 0, got {shape!r}")
    if len(shape) > 16:
        raise BadRequest(f"input {name!r}: {len(shape)} dims; at most 16")
    return tuple(shape)


def element_count(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def from_bytes(raw, datatype: str, shape, name: str) -> np.ndarray:
    """An array from its raw little-endian, row-major bytes (no copy beyond the one numpy
    needs to own them); the byte count must be exactly what the shape and datatype need."""
    dtype = numpy_dtype(datatype, name).newbyteorder("<")
    shape = checked_shape(shape, name)
    want = element_count(shape) * dtype.itemsize
    if len(raw) != want:
        raise BadRequest(f"input {name!r}: {len(raw)} bytes of data; shape {list(shape)} of "
                         f"{datatype} needs {want}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def from_json(data, datatype: str, shape, name: str) -> np.ndarray:
    """An array from JSON data: flat or nested lists of numbers (or true/false for BOOL)."""
    dtype = numpy_dtype(datatype, name)
    shape = checked_shape(shape, name)
    try:
        flat = np.asarray(data, dtype=np.float64 if dtype.kind == "f" else None).reshape(-1)
    except (TypeError, ValueError) as err:
        raise BadRequest(f"input {name!r}: data is not a list of numbers ({err})") from None
    if flat.size != element_count(shape):
        raise BadRequest(f"input {name!r}: {flat.size} values; shape {list(shape)} needs "
                         f"{element_count(shape)}")
    if flat.dtype.kind not in "biuf":
        raise BadRequest(f"input {name!r}: data is not a list of numbers")
    if dtype.kind in "iu" and flat.dtype.kind == "f" and not np.all(np.mod(flat, 1) == 0):
        raise BadRequest(f"input {name!r}: {datatype} data holds non-integer values")
    if dtype.kind in "iu" and flat.size:
        info = np.iinfo(dtype)
        if flat.min() < info.min or flat.max() > info.max:
            raise BadRequest(f"input {name!r}: values outside the range of {datatype}")
    return flat.astype(dtype).reshape(shape)


def to_json_data(array: np.ndarray) -> list:
    """Row-major flat list, as the protocol's JSON form carries tensor data."""
    flat = array.reshape(-1)
    if flat.dtype.kind == "f" and flat.dtype.itemsize < 4:  # fp16/bf16: JSON has no half
        flat = flat.astype(np.float32)
    return flat.tolist()


def to_bytes(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
