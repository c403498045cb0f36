"""Narrow ONNX types (4- and 2-bit integers, float8, float4) carried in bytes.

Why: TVM 0.27 cannot hold them at run time (DLPack has no 4-bit or float8 tensors; int4 fails
"dtype.bits % 8 == 0") and its float8 casts were wrong (24 node-suite cases) or failed to
vectorize. Models with int4 weights or float8 activations are what quantized exports produce.

How: every tensor of such a type becomes a byte tensor. Narrow integers hold their value
(int4 -> int8, uint4 -> uint8); float8/float4 hold their bit code (uint8). The ops that give the
types meaning are re-expressed on the bytes, as the spec (and onnx's reference, which uses
ml_dtypes) defines them:
  - Cast from a narrow integer is a Cast of its value; Cast to one truncates to int32 and wraps
    (two's complement, as ml_dtypes does).
  - Cast from float8/float4 reads a 256-entry table of the code's value (exact).
  - Cast to float8/float4 rounds to the nearest representable value, ties to an even code, by
    comparison with the sorted table of values; overflow saturates (saturate=1) or gives the
    type's code for infinity/NaN; NaN gives its NaN code.
  - QuantizeLinear to a narrow integer clamps to its range; DequantizeLinear of one reads the
    value; float8 Quantize/Dequantize go through the conversions above.
Ops that only move data (Reshape, Transpose, Identity...) work on the bytes unchanged.
The runtime converts at the boundary (runtime/exotic_dtypes.py): the signature keeps the
user's dtype.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .onnx_graph import GraphInfo, node_attrs

# ONNX type -> (byte type it is carried in, "value" or "code").
NARROW_INTS = {TensorProto.INT4: TensorProto.INT8, TensorProto.UINT4: TensorProto.UINT8}
for _name, _byte in (("INT2", TensorProto.INT8), ("UINT2", TensorProto.UINT8)):
    if hasattr(TensorProto, _name):
        NARROW_INTS[getattr(TensorProto, _name)] = _byte
MINIFLOATS = tuple(getattr(TensorProto, n) for n in (
    "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT4E2M1")
    if hasattr(TensorProto, n))
CARRIED = {**NARROW_INTS, **{t: TensorProto.UINT8 for t in MINIFLOATS}}


def carried_type(elem_type: int) -> int:
    """The byte type a tensor of ``elem_type`` is carried in (itself when not narrow)."""
    return CARRIED.get(elem_type, elem_type)


def _np(elem_type: int):
    return helper.tensor_dtype_to_np_dtype(elem_type)


def _bits(elem_type: int) -> int:
    return 4 if elem_type in (TensorProto.INT4, TensorProto.UINT4) else 2 if elem_type in (
        getattr(TensorProto, "INT2", -1), getattr(TensorProto, "UINT2", -1)) else 8


class _Emitter:
    """Appends nodes with fresh output names; constants become Constant nodes."""

    def __init__(self, info: GraphInfo):
        self.info, self.nodes = info, []

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.info.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def const(self, value, dtype) -> str:
        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(value, dtype)))


class MinifloatTable:
    """Everything a float8/float4 conversion needs about one type, read from ml_dtypes (the
    library onnx's reference uses), so that rounding, overflow and NaN codes agree with it."""

    def __init__(self, elem_type: int):
        dtype = np.dtype(_np(elem_type))
        self.width = 4 if elem_type == getattr(TensorProto, "FLOAT4E2M1", -1) else 8
        codes = np.arange(2 ** self.width, dtype=np.uint8)
        self.values = codes.view(dtype).astype(np.float32)
        self.sign = int(self.code(-1.0, dtype) ^ self.code(1.0, dtype))
        finite = [(v, int(c)) for c, v in zip(codes, self.values)
                  if np.isfinite(v) and v >= 0 and not (int(c) & self.sign)]
        finite.sort()
        self.ordered = np.array([v for v, _ in finite], np.float32)
        self.ordered_codes = np.array([c for _, c in finite], np.int64)
        self.max = float(self.ordered[-1])
        self.max_code = int(self.ordered_codes[-1])
        self.nan = self.code(np.nan, dtype)
        self.overflow = self.code(np.inf, dtype)       # non-saturating overflow: inf or NaN
        self.neg_overflow = self.code(-np.inf, dtype)
        self.negative_zero = self.code(-0.0, dtype) != 0
        # Halfway between max and the next value of the same spacing: past it a
        # non-saturating cast overflows.
        self.overflow_from = self.max + (self.max - float(self.ordered[-2])) / 2

    @staticmethod
    def code(value: float, dtype) -> int:
        return int(np.array([value], np.float32).astype(dtype).view(np.uint8)[0])


def value_of_code(em: _Emitter, code: str, elem_type: int) -> str:
    """float32 value of a float8/float4 code (uint8 tensor): a table lookup, exact."""
    table = MinifloatTable(elem_type)
    index = em.op("Cast", [code], to=TensorProto.INT64)
    return em.op("Gather", [em.const(table.values, np.float32), index], axis=0)


def code_of_value(em: _Emitter, x32: str, elem_type: int, saturate: bool, out: str) -> str:
    """The float8/float4 code (uint8) nearest to float32 ``x32``, ties to the even code."""
    t = MinifloatTable(elem_type)
    n = len(t.ordered)
    mag = em.op("Abs", [x32])
    column = em.op("Unsqueeze", [mag, em.const([-1], np.int64)])
    # index of the largest table value <= |x| (the table starts at 0, so it exists for |x| >= 0)
    below = em.op("Cast", [em.op("LessOrEqual", [em.const(t.ordered[1:], np.float32), column])],
                  to=TensorProto.INT64)
    lo = em.op("ReduceSum", [below, em.const([-1], np.int64)], keepdims=0)
    hi = em.op("Min", [em.op("Add", [lo, em.const(1, np.int64)]), em.const(n - 1, np.int64)])
    values, codes = em.const(t.ordered, np.float32), em.const(t.ordered_codes, np.int64)
    even = em.const(t.ordered_codes % 2 == 0, np.bool_)
    d_lo = em.op("Sub", [mag, em.op("Gather", [values, lo], axis=0)])
    d_hi = em.op("Sub", [em.op("Gather", [values, hi], axis=0), mag])
    code_lo = em.op("Gather", [codes, lo], axis=0)
    code_hi = em.op("Gather", [codes, hi], axis=0)
    # Selects only (no And/Or of bool tensors: LLVM rejected TVM's vectorized i1 or/and).
    on_tie = em.op("Where", [em.op("Gather", [even, hi], axis=0), code_hi, code_lo])
    closer = em.op("Where", [em.op("Less", [d_hi, d_lo]), code_hi, code_lo])
    nearest = em.op("Where", [em.op("Equal", [d_hi, d_lo]), on_tie, closer])
    negative = em.op("Less", [x32, em.const(0, np.float32)])
    with_sign = em.op("Add", [nearest, em.const(t.sign, np.int64)])
    if not t.negative_zero:  # fnuz types: -tiny rounds to +0, 0x80 is NaN
        with_sign = em.op("Where", [em.op("Equal", [nearest, em.const(0, np.int64)]),
                                    nearest, with_sign])
    signed = em.op("Where", [negative, with_sign, nearest])
    if saturate:
        big_pos, big_neg, limit = t.max_code, t.max_code + t.sign, t.max
    else:
        big_pos, big_neg, limit = t.overflow, t.neg_overflow, t.overflow_from
    # A tie at the overflow threshold goes to the even code: max when max's code is even.
    at_limit_overflows = not saturate and t.max_code % 2 == 1
    over = em.op("GreaterOrEqual" if at_limit_overflows else "Greater",
                 [mag, em.const(limit, np.float32)])
    big = em.op("Where", [negative, em.const(big_neg, np.int64), em.const(big_pos, np.int64)])
    finite = em.op("Where", [over, big, signed])
    code = em.op("Where", [em.op("IsNaN", [x32]), em.const(t.nan, np.int64), finite])
    return em.op("Cast", [code], out, to=TensorProto.UINT8)


def wrap_to_narrow_int(em: _Emitter, x: str, elem_type: int, out: str) -> str:
    """int4/uint4/int2/uint2 from any number: truncate to int32, keep the low bits (two's
    complement wrap, as ml_dtypes casts), carried in int8/uint8."""
    bits = _bits(elem_type)
    v = em.op("Cast", [x], to=TensorProto.INT32)
    low = em.op("BitwiseAnd", [v, em.const(2 ** bits - 1, np.int32)])
    if elem_type in (TensorProto.INT4, getattr(TensorProto, "INT2", -1)):
        high = em.op("GreaterOrEqual", [low, em.const(2 ** (bits - 1), np.int32)])
        low = em.op("Where", [high, em.op("Sub", [low, em.const(2 ** bits, np.int32)]), low])
    return em.op("Cast", [low], out, to=NARROW_INTS[elem_type])


def _convert(em: _Emitter, x: str, src: int, dst: int, saturate: bool, out: str) -> None:
    """``out`` = Cast(x: src, to=dst) on carried tensors."""
    if src in MINIFLOATS:
        x, src = value_of_code(em, x, src), TensorProto.FLOAT
    if dst in MINIFLOATS:
        x32 = x if src == TensorProto.FLOAT else em.op("Cast", [x], to=TensorProto.FLOAT)
        code_of_value(em, x32, dst, saturate, out)
    elif dst in NARROW_INTS:
        wrap_to_narrow_int(em, x, dst, out)
    else:
        em.op("Cast", [x], out, to=dst)


def cast(node, info: GraphInfo):
    attrs = node_attrs(node)
    src = info.elem_type(node.input[0])
    dst = attrs["to"] if node.op_type == "Cast" else info.elem_type(node.input[1])
    if src is None or dst is None or (src not in CARRIED and dst not in CARRIED):
        return None
    em = _Emitter(info)
    _convert(em, node.input[0], src, dst, bool(attrs.get("saturate", 1)), node.output[0])
    return em.nodes


def _broadcastable(em: _Emitter, info: GraphInfo, node, name: str, x: str) -> str:
    """``name`` (a scale or zero point) shaped to broadcast against ``x``: per-tensor as it
    is, per-axis reshaped onto the axis, blocked (block_size) repeated along the axis."""
    attrs = node_attrs(node)
    shape, rank = info.shape(node.input[1]) or [], len(info.shape(x) or [])
    axis = attrs.get("axis", 1) % max(rank, 1)
    block = attrs.get("block_size", 0)
    if block:
        repeat = np.arange(info.shape(x)[axis]) // block
        return em.op("Gather", [name, em.const(repeat, np.int64)], axis=axis)
    if len(shape) != 1 or shape[0] == 1:
        return name
    target = [shape[0] if d == axis else 1 for d in range(rank)]
    return em.op("Reshape", [name, em.const(target, np.int64)])


def _int_range(elem_type: int) -> tuple[int, int]:
    if elem_type in NARROW_INTS:
        bits = _bits(elem_type)
        signed = elem_type in (TensorProto.INT4, getattr(TensorProto, "INT2", -1))
        return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    limits = np.iinfo(_np(elem_type))
    return int(limits.min), int(limits.max)


def _as_float(em: _Emitter, info: GraphInfo, node, name: str, x: str) -> str:
    return _broadcastable(em, info, node, em.op("Cast", [name], to=TensorProto.FLOAT), x)


def quantize(node, info: GraphInfo):
    """QuantizeLinear to a narrow type, or blocked (TVM has neither):
    q = saturate(round(x / scale) + zero_point)."""
    attrs = node_attrs(node)
    zero = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    dst = info.elem_type(zero) if zero else attrs.get("output_dtype", 0) or TensorProto.UINT8
    if dst not in CARRIED and not attrs.get("block_size", 0):
        return None
    em = _Emitter(info)
    x = node.input[0]
    scaled = em.op("Div", [em.op("Cast", [x], to=TensorProto.FLOAT),
                           _as_float(em, info, node, node.input[1], x)])
    if dst in MINIFLOATS:  # float8 zero points are 0 by the spec
        code_of_value(em, scaled, dst, bool(attrs.get("saturate", 1)), node.output[0])
        return em.nodes
    lo, hi = _int_range(dst)
    q = em.op("Round", [scaled])
    if zero:
        q = em.op("Add", [q, _as_float(em, info, node, zero, x)])
    q = em.op("Clip", [q, em.const(lo, np.float32), em.const(hi, np.float32)])
    em.op("Cast", [q], node.output[0], to=carried_type(dst))
    return em.nodes


def dequantize(node, info: GraphInfo):
    """DequantizeLinear of a narrow type, or blocked:
    y = (value(x) - value(zero_point)) * scale."""
    src = info.elem_type(node.input[0])
    if src not in CARRIED and not node_attrs(node).get("block_size", 0):
        return None
    em = _Emitter(info)
    x = node.input[0]
    out_type = info.elem_type(node.input[1]) or TensorProto.FLOAT

    def value(name):
        return value_of_code(em, name, src) if src in MINIFLOATS else \
            em.op("Cast", [name], to=TensorProto.FLOAT)
    v = value(x)
    if len(node.input) > 2 and node.input[2]:
        v = em.op("Sub", [v, _broadcastable(em, info, node, value(node.input[2]), x)])
    y = em.op("Mul", [v, _as_float(em, info, node, node.input[1], x)])
    em.op("Cast", [y], node.output[0], to=out_type)
    return em.nodes


NARROW_REWRITES = {"Cast": cast, "CastLike": cast, "QuantizeLinear": quantize,
                   "DequantizeLinear": dequantize}


def carry_narrow_types(model: onnx.ModelProto, info: GraphInfo) -> onnx.ModelProto:
    """A copy of ``model`` in which no tensor has a narrow type (see the module docstring).
    Callers check ``needs_carrying`` first: ``info`` costs a shape inference."""
    nodes = []
    for node in model.graph.node:
        rewrite = NARROW_REWRITES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        replaced = rewrite(node, info) if rewrite else None
        nodes.extend(replaced if replaced is not None else [_retyped_constant(node)])
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    for value in list(out.graph.input) + list(out.graph.output) + list(out.graph.value_info):
        tensor = value.type.tensor_type
        tensor.elem_type = carried_type(tensor.elem_type)
    initializers = [_carried_tensor(t) for t in out.graph.initializer]
    del out.graph.initializer[:]
    out.graph.initializer.extend(initializers)
    return out


def needs_carrying(model: onnx.ModelProto) -> bool:
    """Whether any tensor of the model has a narrow type, or a Q/DQ node is blocked. Read from
    the model alone: a narrow tensor is declared (inputs, outputs, initializers, Constant
    values) or made by a node whose attribute names the type (Cast ``to``, QuantizeLinear
    ``output_dtype``), so no shape inference is needed to tell."""
    values = list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)
    return (any(v.type.tensor_type.elem_type in CARRIED for v in values)
            or any(t.data_type in CARRIED for t in model.graph.initializer)
            or any(_node_mentions_narrow(n) for n in model.graph.node)
            or any(n.op_type in NARROW_REWRITES and node_attrs(n).get("block_size", 0)
                   for n in model.graph.node))


def _node_mentions_narrow(node) -> bool:
    for attr in node.attribute:
        if attr.name in ("to", "output_dtype") and attr.i in CARRIED:
            return True
        if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in CARRIED:
            return True
    return False


def _carried_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    if tensor.data_type not in CARRIED:
        return tensor
    array = numpy_helper.to_array(tensor)
    stored = array.view(np.uint8) if tensor.data_type in MINIFLOATS and array.dtype.itemsize == 1 \
        else array.astype(_np(CARRIED[tensor.data_type]))
    return numpy_helper.from_array(np.ascontiguousarray(stored), tensor.name)


def _retyped_constant(node):
    if node.op_type != "Constant" or not _node_mentions_narrow(node):
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for attr in copy.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            attr.t.CopyFrom(_carried_tensor(attr.t))
    return copy
