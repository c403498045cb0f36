"""FoldConstantsNumpy: constant arithmetic, comparisons, shape reads and reshaping of common ops
computed with numpy.

Why: TVM's FoldConstant compiles every foldable call with LLVM to evaluate it, tens of
milliseconds each, and a BatchNorm decomposition plus the NHWC conversion leave hundreds of
such calls on weights (expand_dims, add, sqrt, divide, broadcast_to, transposes), which then
dominate the compile. ONNX's Shape -> Gather idiom (a dim read from a static shape, its
negative index made positive with less/add/where) leaves such calls in most exported graphs.
numpy computes the same IEEE float results (add/subtract/multiply/divide/sqrt are correctly
rounded in both), the same comparisons and the same gathers, in microseconds.

What: a call of an op in FOLDERS whose arguments are all constants (or variables bound to
constants folded here) becomes a constant, if the result has the dtype and shape the binding
declares. ``shape_to_tensor`` of a shape whose dims are all known folds too. Integer division
and casts are left to TVM (their rounding rules differ from numpy's), as is a ``take`` with an
index out of range (TVM's fast mode reads no bounds; numpy would wrap or raise). Anything else
is left for TVM's FoldConstant, which runs right after.

Where: before each FoldConstant of the simplify and layout phases.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ...frontends.relax_shapes import static_shape, static_values
from ...relax_walk import mutate_functions

_MAX_ELEMENTS = 1 << 26  # a broadcast to more than this stays a run-time op


_ARITHMETIC = {np.dtype(t) for t in ("float32", "float64", "int8", "int16", "int32", "int64",
                                      "uint8", "uint16", "uint32", "uint64")}


def _binary(fn):
    def fold(args, _call):
        a, b = args
        if a.dtype not in _ARITHMETIC or (fn is np.divide and a.dtype.kind != "f"):
            return None  # half types and integer division: TVM's rounding rules
        return fn(a, b)
    return fold


def _unary(fn):
    return lambda args, _call: fn(args[0]) if args[0].dtype in _ARITHMETIC else None


def _permute(args, call):
    axes = call.attrs.axes
    return np.transpose(args[0], None if axes is None else [int(a) for a in axes])


def _expand_dims(args, call):
    out = args[0]
    ndim = out.ndim + len(call.attrs.axis)
    for axis in sorted(int(a) % ndim for a in call.attrs.axis):
        out = np.expand_dims(out, axis)
    return out


def _squeeze(args, call):
    axis = call.attrs.axis
    return np.squeeze(args[0], None if axis is None else tuple(int(a) for a in axis))


def _to_shape(args, call):
    shape = static_values(call.args[1])
    if shape is None or int(np.prod(shape)) > _MAX_ELEMENTS:
        return None
    if call.op.name == "relax.reshape":
        return args[0].reshape(shape)
    return np.broadcast_to(args[0], shape).copy()


def _compare(fn):
    def fold(args, _call):
        a, b = args
        return fn(a, b) if a.dtype in _ARITHMETIC and b.dtype == a.dtype else None
    return fold


def _where(args, _call):
    cond, a, b = args
    return np.where(cond, a, b) if cond.dtype == np.bool_ and a.dtype == b.dtype else None


def _take(args, call):
    data, indices = args
    axis = call.attrs.axis
    extent = data.size if axis is None else data.shape[int(axis)]
    if indices.dtype.kind not in "iu" or np.any(indices < 0) or np.any(indices >= extent):
        return None
    return np.take(data, indices, axis=None if axis is None else int(axis))


def _shape_to_tensor(_args, call):
    dims = static_values(getattr(call.args[0], "ty", None))
    return None if dims is None else np.array(dims, dtype="int64")


FOLDERS = {
    "relax.add": _binary(np.add), "relax.subtract": _binary(np.subtract),
    "relax.multiply": _binary(np.multiply), "relax.divide": _binary(np.divide),
    "relax.negative": _unary(np.negative), "relax.sqrt": _unary(np.sqrt),
    "relax.permute_dims": _permute, "relax.expand_dims": _expand_dims,
    "relax.squeeze": _squeeze, "relax.reshape": _to_shape, "relax.broadcast_to": _to_shape,
    "relax.less": _compare(np.less), "relax.less_equal": _compare(np.less_equal),
    "relax.greater": _compare(np.greater), "relax.greater_equal": _compare(np.greater_equal),
    "relax.equal": _compare(np.equal), "relax.not_equal": _compare(np.not_equal),
    "relax.where": _where, "relax.take": _take, "relax.shape_to_tensor": _shape_to_tensor,
}
# the arguments that are data (the rest are shapes, read from the call itself)
_DATA_ARGS = {"relax.reshape": 1, "relax.broadcast_to": 1, "relax.shape_to_tensor": 0}


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.known: dict = {}  # var -> its folded numpy value, or the constant bound to it

    def visit_var_binding_(self, binding) -> None:
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
                and value.op.name in FOLDERS:
            folded = self._fold(value, binding.var)
            if folded is not None:
                self.known[binding.var] = folded
                binding = relax.VarBinding(binding.var, relax.const(folded, str(folded.dtype)))
        elif isinstance(value, tvm.ir.GenericConst):
            self.known[binding.var] = value  # read into numpy only if a fold uses it
        self.builder_.emit_normalized(binding)

    def visit_match_cast_(self, binding) -> None:
        self.builder_.emit_normalized(binding)

    def _fold(self, call: relax.Call, var) -> np.ndarray | None:
        count = _DATA_ARGS.get(call.op.name, len(call.args))
        args = [self._constant(a) for a in call.args[:count]]
        if any(a is None for a in args):
            return None
        with np.errstate(all="ignore"):  # inf/nan as IEEE defines them, as TVM computes them
            out = FOLDERS[call.op.name](args, call)
        if out is None:
            return None
        # np.array, not ascontiguousarray: numpy ops on 0-d arrays return scalars, and
        # ascontiguousarray makes those 1-d (DynamicQuantizeLinear's scale broke a Stack)
        out = np.array(out, order="C")
        return out if _matches(out, var) else None

    def _constant(self, expr) -> np.ndarray | None:
        known = self.known.get(expr) if isinstance(expr, relax.Var) else expr
        if isinstance(known, tvm.ir.GenericConst):
            return known.value.numpy()
        return known if isinstance(known, np.ndarray) else None


def _matches(value: np.ndarray, var) -> bool:
    """Whether ``value`` has exactly the dtype and static shape the binding declares."""
    return str(value.dtype) == str(getattr(var.ty, "dtype", "")) and \
        static_shape(var) == list(value.shape)


@tvm.transform.module_pass(opt_level=0, name="FoldConstantsNumpy")
class FoldConstantsNumpy:
    """See the module docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_functions(mod, _Folder(mod))
