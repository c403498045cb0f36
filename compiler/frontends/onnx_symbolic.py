"""Shape arithmetic over symbolic dims (batch, sequence), evaluated while importing.

Why: exporters compute shapes at run time (``Shape -> Gather -> Unsqueeze -> Concat ->
Reshape``; ``Range`` over the sequence length for position ids and causal masks; ``Expand`` of
the attention mask). With every input dim fixed, onnx_fold.py folds these to constants. With a
named dim left free (a model exported with dynamic axes) they cannot fold, and TVM 0.27's
importer loses track of them: its shape values stop at ops that "cannot handle ShapeExpr
inputs", its Range makes a length it never binds, its Expand broadcasts one way only.

How: a shape value is kept as symbolic integers (TIR expressions over the inputs' dim vars,
each known to be >= 1) through the ops that compute shapes: Shape, Gather, Slice, Concat,
(Un)squeeze, Cast, integer arithmetic, comparisons the bounds decide, Where on a decided
condition. Each such value is also emitted as a real tensor (``shape_to_tensor``), so any other
consumer reads it as data. The ops that take a shape use the symbolic values directly:
Reshape, Expand (broadcasting both ways, as ONNX defines it), ConstantOfShape, Range and
Slice. Anything the bounds cannot decide falls back to the tensor and TVM's converters.

Where: AotcImporter asks ``convert`` before any other converter."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import tvm
from tvm import relax, tirx
from tvm.relax import op as R
from tvm.sym.analyzer import Analyzer, ConstIntBound

from aotc.errors import UnsupportedModelError

INT = "int64"
MAX_DIM = 1 << 40
_INT_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


@dataclass(frozen=True)
class SymValue:
    """An integer (or bool) tensor of rank 0 or 1 whose elements are TIR expressions."""
    values: tuple
    scalar: bool
    dtype: str

    @property
    def constant(self) -> bool:
        return all(isinstance(v, tirx.IntImm) for v in self.values)


def _imm(value: int) -> tirx.IntImm:
    return tirx.IntImm(INT, int(value))


class SymbolicShapes:
    """The symbolic values met so far in one import, and the converters that use them."""

    def __init__(self, bb: relax.BlockBuilder):
        self.bb = bb
        self.known: dict[relax.Expr, SymValue] = {}
        self.analyzer = Analyzer()
        self.bounded: set = set()
        # dim name -> (min, max) the model needs; the runtime refuses inputs outside them
        self.ranges: dict[str, tuple[int, int]] = {}

    # -- reading values -------------------------------------------------------------------
    def bound_dims(self, shape) -> None:
        """Dims of an input are at least 1 (a zero-size batch or sequence is not served)."""
        for dim in shape:
            if isinstance(dim, tirx.Var) and dim not in self.bounded:
                self.bounded.add(dim)
                self.analyzer.update(dim, ConstIntBound(1, MAX_DIM), override=True)

    def limit(self, dim: tirx.Var, low: int, high: int, reason: str) -> None:
        """Narrow ``dim`` to [low, high] (intersected with what is known already)."""
        name = dim.name
        old_low, old_high = self.ranges.get(name, (1, MAX_DIM))
        low, high = max(low, old_low), min(high, old_high)
        if low > high:
            raise UnsupportedModelError(
                f"dim {name!r} must be in [{low}, {high}], which is empty ({reason})")
        self.ranges[name] = (low, high)
        self.analyzer.update(dim, ConstIntBound(low, high), override=True)

    def value_of(self, expr) -> SymValue | None:
        if expr is None:
            return None
        if expr in self.known:
            return self.known[expr]
        if isinstance(expr, relax.ShapeExpr):
            return SymValue(tuple(expr.values), False, INT)
        if isinstance(expr, tvm.ir.GenericConst):
            array = expr.value.numpy()
            if array.ndim <= 1 and array.size <= 64 and \
                    (str(array.dtype) in _INT_DTYPES or array.dtype == bool):
                return SymValue(tuple(_imm(v) for v in array.reshape(-1)), array.ndim == 0,
                                str(array.dtype))
        return None

    def simplify(self, expr):
        return self.analyzer.simplify(expr)

    def decide(self, condition) -> bool | None:
        if self.analyzer.can_prove(condition):
            return True
        if self.analyzer.can_prove(tirx.Not(condition)):
            return False
        return None

    # -- entry point ---------------------------------------------------------------------
    def convert(self, op: str, inputs: list, attrs: dict) -> relax.Expr | None:
        """A Relax expression for the node, or None to leave it to the other converters."""
        if op == "Shape":
            return self._shape(inputs[0], attrs)
        values = [self.value_of(x) for x in inputs]
        evaluate = _ARITHMETIC.get(op)
        present = [v for x, v in zip(inputs, values) if x is not None]
        if evaluate is not None and present and all(v is not None for v in present):
            result = evaluate(self, values, attrs)
            if result is not None:
                return self.emit(result)
        consumer = _CONSUMERS.get(op)
        return consumer(self, inputs, values, attrs) if consumer is not None else None

    def emit(self, value: SymValue) -> relax.Expr:
        """The value as a tensor, remembered as symbolic (a constant when it is one)."""
        if value.constant:
            array = np.array([int(v.value) for v in value.values]).astype(value.dtype)
            return relax.const(array.reshape(()) if value.scalar else array, value.dtype)
        values = [tirx.Cast(INT, v) if str(v.ty.dtype) != INT else v for v in value.values]
        tensor = R.shape_to_tensor(relax.ShapeExpr([self.simplify(v) for v in values]))
        if value.scalar:
            tensor = R.reshape(tensor, ())
        if value.dtype != INT:
            tensor = R.astype(tensor, value.dtype)
        var = self.bb.emit(tensor)
        self.known[var] = value
        return var

    def _shape(self, data, attrs) -> relax.Expr | None:
        shape = getattr(data.ty, "shape", None)
        if not isinstance(shape, relax.ShapeExpr):
            return None
        dims = list(shape.values)
        if all(isinstance(d, tirx.IntImm) for d in dims):
            return None
        rank = len(dims)
        start, end = attrs.get("start", 0), attrs.get("end", rank)
        start, end = (max(0, min(rank, v + rank if v < 0 else v)) for v in (start, end))
        return self.emit(SymValue(tuple(dims[start:end]), False, INT))


# -- shape arithmetic ----------------------------------------------------------------------
def _broadcast(values: list[SymValue]) -> list[tuple] | None:
    """Elementwise operands broadcast to one length (rank <= 1 only)."""
    length = max(len(v.values) for v in values)
    out = []
    for v in values:
        if len(v.values) == length:
            out.append(v.values)
        elif len(v.values) == 1:
            out.append(v.values * length)
        else:
            return None
    return out


def _elementwise(fn, result_dtype=None):
    def evaluate(sym: SymbolicShapes, values, attrs):
        present = [v for v in values if v is not None]
        operands = _broadcast(present)
        if operands is None:
            return None
        dtype = result_dtype or present[0].dtype
        if dtype not in _INT_DTYPES and dtype != "bool":
            return None
        results = []
        for items in zip(*operands):
            value = fn(sym, *items)
            if value is None:
                return None
            results.append(value)
        return SymValue(tuple(results), all(v.scalar for v in present), dtype)
    return evaluate


def _decided(fn):
    def compare(sym, a, b):
        answer = sym.decide(fn(a, b))
        return None if answer is None else tirx.IntImm(INT, int(answer))
    return compare


def _where(sym, cond, a, b):
    if not isinstance(cond, tirx.IntImm):
        return None
    return a if cond.value else b


def _gather(sym, values, attrs):
    data, index = values
    if data.scalar or attrs.get("axis", 0) != 0 or not index.constant:
        return None
    picked = []
    for i in index.values:
        k = int(i.value)
        k = k + len(data.values) if k < 0 else k
        if not 0 <= k < len(data.values):
            return None
        picked.append(data.values[k])
    return SymValue(tuple(picked), index.scalar, data.dtype)


def _unsqueeze(sym, values, attrs):
    data = values[0]
    axes = values[1].values if len(values) > 1 and values[1] is not None else attrs.get("axes")
    if not data.scalar or axes is None or [int(a) for a in axes] not in ([0], [-1]):
        return None
    return SymValue(data.values, False, data.dtype)


def _squeeze(sym, values, attrs):
    data = values[0]
    if data.scalar or len(data.values) != 1:
        return None
    return SymValue(data.values, True, data.dtype)


def _concat(sym, values, attrs):
    if any(v is None or v.scalar for v in values):
        return None
    return SymValue(tuple(x for v in values for x in v.values), False, values[0].dtype)


def _slice_values(sym, values, attrs):
    data = values[0]
    rest = values[1:] + [None] * (4 - len(values[1:]))
    starts, ends, axes, steps = rest
    if data.scalar or starts is None or ends is None or not (starts.constant and ends.constant):
        return None
    if (axes is not None and [int(a) for a in axes.values] not in ([0], [-1])) or \
            (steps is not None and not steps.constant):
        return None
    step = int(steps.values[0]) if steps is not None else 1
    picked = list(data.values)[slice(int(starts.values[0]), int(ends.values[0]), step)]
    return SymValue(tuple(picked), False, data.dtype)


def _cast(sym, values, attrs):
    dtype = str(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"]))
    data = values[0]
    if dtype in _INT_DTYPES:
        return SymValue(data.values, data.scalar, dtype)
    if dtype == "bool":
        flags = [sym.decide(v != 0) for v in data.values]
        if None in flags:
            return None
        return SymValue(tuple(_imm(f) for f in flags), data.scalar, "bool")
    return None


def _reshape_values(sym, values, attrs):
    data, shape = values
    if not shape.constant:
        return None
    target = [int(d) for d in shape.values]
    if target == [] and len(data.values) == 1:
        return SymValue(data.values, True, data.dtype)
    if len(target) == 1 and target[0] in (-1, len(data.values)):
        return SymValue(data.values, False, data.dtype)
    return None


def _identity(sym, values, attrs):
    return values[0]


def _not(sym, a):
    return tirx.IntImm(INT, 1 - int(a.value)) if isinstance(a, tirx.IntImm) else None


def _logical(fn):
    def combine(sym, a, b):
        if isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm):
            return tirx.IntImm(INT, int(fn(bool(a.value), bool(b.value))))
        return None
    return combine


def _where_op(sym, values, attrs):
    if values[0] is None or any(v is None for v in values[1:]):
        return None
    operands = _broadcast(values)
    if operands is None:
        return None
    picked = [_where(sym, c, a, b) for c, a, b in zip(*operands)]
    if any(p is None for p in picked):
        return None
    return SymValue(tuple(picked), all(v.scalar for v in values), values[1].dtype)


_ARITHMETIC = {
    "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Concat": _concat,
    "Slice": _slice_values, "Cast": _cast, "Reshape": _reshape_values, "Identity": _identity,
    "Add": _elementwise(lambda s, a, b: a + b),
    "Sub": _elementwise(lambda s, a, b: a - b),
    "Mul": _elementwise(lambda s, a, b: a * b),
    # ONNX integer Div truncates toward zero; Mod (fmod=0) takes the divisor's sign
    "Div": _elementwise(lambda s, a, b: tirx.truncdiv(a, b)),
    "Mod": _elementwise(lambda s, a, b: tirx.floormod(a, b)),
    "Max": _elementwise(lambda s, a, b: tirx.max(a, b)),
    "Min": _elementwise(lambda s, a, b: tirx.min(a, b)),
    "Neg": _elementwise(lambda s, a: -a),
    "Equal": _elementwise(_decided(lambda a, b: a == b), "bool"),
    "Less": _elementwise(_decided(lambda a, b: a < b), "bool"),
    "LessOrEqual": _elementwise(_decided(lambda a, b: a <= b), "bool"),
    "Greater": _elementwise(_decided(lambda a, b: a > b), "bool"),
    "GreaterOrEqual": _elementwise(_decided(lambda a, b: a >= b), "bool"),
    "Not": _elementwise(_not, "bool"),
    "And": _elementwise(_logical(lambda a, b: a and b), "bool"),
    "Or": _elementwise(_logical(lambda a, b: a or b), "bool"),
    "Where": _where_op,
}




# -- consumers of shape values -------------------------------------------------------------
def _data_dims(data) -> list | None:
    shape = getattr(data.ty, "shape", None)
    return list(shape.values) if isinstance(shape, relax.ShapeExpr) else None


def _usable(value: SymValue | None) -> bool:
    """A symbolic (not all-constant) 1-D value: TVM's converters take the constant ones."""
    return value is not None and not value.scalar and not value.constant


def _reshape(sym, inputs, values, attrs):
    data, shape = inputs[0], values[1]
    dims = _data_dims(data)
    if not _usable(shape) or dims is None:
        return None
    target = list(shape.values)
    allow_zero = attrs.get("allowzero", 0)
    for k, dim in enumerate(target):
        if isinstance(dim, tirx.IntImm) and dim.value == 0 and not allow_zero:
            target[k] = dims[k]
    unknown = [k for k, d in enumerate(target) if isinstance(d, tirx.IntImm) and d.value == -1]
    if len(unknown) > 1:
        return None
    if unknown:
        total, rest = _imm(1), _imm(1)
        for d in dims:
            total = total * d
        for k, d in enumerate(target):
            if k != unknown[0]:
                rest = rest * d
        target[unknown[0]] = tirx.floordiv(total, rest)
    return R.reshape(data, relax.ShapeExpr([sym.simplify(d) for d in target]))


def _expand(sym, inputs, values, attrs):
    """ONNX Expand broadcasts both ways: a 1 in the shape keeps the data's dim."""
    data, shape = inputs[0], values[1]
    dims = _data_dims(data)
    if dims is None or all(isinstance(d, tirx.IntImm) for d in dims) and \
            shape is not None and shape.constant:
        return None  # static: onnx_rewrites made the shape the full broadcast already
    if shape is None or shape.scalar:
        return _expand_at_run_time(sym, data, inputs[1], dims)
    target = list(shape.values)
    rank = max(len(target), len(dims))
    target = [_imm(1)] * (rank - len(target)) + target
    dims = [_imm(1)] * (rank - len(dims)) + dims
    out = []
    for want, have in zip(target, dims):
        if sym.decide(want == 1):
            out.append(have)
        elif sym.decide(have == 1) or sym.decide(want == have):
            out.append(want)
        else:
            return _expand_at_run_time(sym, data, inputs[1], dims)
    if len(dims) > len(_data_dims(data)):
        data = R.reshape(data, relax.ShapeExpr(dims))
    return R.broadcast_to(data, relax.ShapeExpr([sym.simplify(d) for d in out]))


def _expand_at_run_time(sym, data, shape, dims) -> relax.Expr | None:
    """Neither the shape nor its relation to the data is known at compile time: the target is
    computed as a tensor (where the shape says 1, the data's dim) and then taken as a shape."""
    length = _static_length(shape)
    if length is None:
        return None
    rank = max(length, len(dims))
    bb = sym.bb
    shape = R.astype(shape, INT)
    if length < rank:
        shape = R.concat([relax.const(np.ones(rank - length, np.int64)), shape])
    padded = [_imm(1)] * (rank - len(dims)) + dims
    have = R.shape_to_tensor(relax.ShapeExpr(padded))
    target = bb.emit(R.where(R.equal(shape, relax.const(1, INT)), have, shape))
    target = bb.match_cast(target, relax.TensorType([rank], INT))
    shape_value = bb.emit(R.tensor_to_shape(target))
    out = [tirx.Var(f"expand_{k}", INT) for k in range(rank)]
    bb.match_cast(shape_value, relax.ShapeType(out))
    if rank > len(dims):
        data = R.reshape(data, relax.ShapeExpr(padded))
    return R.broadcast_to(data, relax.ShapeExpr(out))


def _static_length(tensor) -> int | None:
    shape = getattr(tensor.ty, "shape", None)
    if isinstance(shape, relax.ShapeExpr) and len(shape.values) == 1 and \
            isinstance(shape.values[0], tirx.IntImm):
        return int(shape.values[0].value)
    return None


def _constant_of_shape(sym, inputs, values, attrs):
    shape = values[0]
    if not _usable(shape):
        return None
    fill = attrs.get("value")
    array = onnx.numpy_helper.to_array(fill) if fill is not None else np.zeros(1, np.float32)
    return R.full(relax.ShapeExpr([sym.simplify(d) for d in shape.values]),
                  relax.const(array.reshape(()), str(array.dtype)))


def _range(sym, inputs, values, attrs):
    if any(v is None or len(v.values) != 1 for v in values) or all(v.constant for v in values):
        return None
    if values[0].dtype not in _INT_DTYPES:
        return None
    start, limit, delta = (sym.simplify(v.values[0]) for v in values)
    return R.arange(start, limit, delta, values[0].dtype)


def _slice(sym, inputs, values, attrs):
    data = inputs[0]
    starts, ends = values[1], values[2]
    axes = values[3] if len(values) > 3 else None
    steps = values[4] if len(values) > 4 else None
    if starts is None or ends is None or (starts.constant and ends.constant) or \
            sym.value_of(data) is not None or _data_dims(data) is None:
        return None
    dims = _data_dims(data)
    rank = len(dims)
    if axes is not None and not axes.constant or steps is not None and not steps.constant:
        return None
    axis_list = [int(a) % rank for a in axes.values] if axes is not None \
        else list(range(len(starts.values)))
    step_list = [int(s) for s in steps.values] if steps is not None else [1] * len(axis_list)
    begin = [sym.simplify(s) for s in starts.values]
    end = [sym.simplify(e) for e in ends.values]
    inbound = True
    for axis, b, e, step in zip(axis_list, begin, end, step_list):
        inbound &= _within(sym, dims[axis], b, e, step)
    return R.strided_slice(data, axis_list, begin, end, step_list, assume_inbound=inbound)


def _within(sym: SymbolicShapes, extent, begin, end, step: int) -> bool:
    """Whether ``begin:end`` (step 1) lies inside ``extent``. A symbolic end cut by a static
    extent (``position_table[:, :seq]``) bounds that dim: longer inputs are refused when the
    model is called, where the clamp would make the slice shorter than the input (onnxruntime
    then fails at the next broadcast)."""
    if step != 1:
        return False
    begin_ok = sym.decide(tirx.all(begin >= 0, begin <= end))
    if isinstance(end, tirx.Var) and isinstance(extent, tirx.IntImm) and \
            sym.decide(end <= extent) is None:
        sym.limit(end, 1, int(extent.value),
                  f"a Slice reads at most {int(extent.value)} rows of a table")
    return bool(begin_ok) and bool(sym.decide(end <= extent))


_CONSUMERS = {"Reshape": _reshape, "Expand": _expand, "ConstantOfShape": _constant_of_shape,
              "Range": _range, "Slice": _slice}
