"""The table of kernels a compiled model runs, embedded in its metadata for ``aotc profile``.

TVM 0.27 has no VM profiler (removed in v0.24), so the profiler calls each kernel of the
library on its own. For that it needs, per kernel: the argument shapes and dtypes, how often
the model calls it, and (for GFLOP/s) its floating-point operation count. All of it is known
only at compile time, from the scheduled module: it is recorded here."""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import relax

from .relax_walk import op_calls

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_CALL_TIR_INPLACE = tvm.ir.Op.get("relax.call_tir_inplace")


def kernel_table(mod: tvm.IRModule) -> list[dict]:
    """One entry per PrimFunc the Relax functions call: name, calls, args, flops (None when
    TVM cannot count them). An arg with a symbolic dim has ``shape: None`` and, from the first
    call of the kernel, ``dims``: each dim an int or an expression over the model's dim names
    (``"(seq + T.int64(7)) // T.int64(8)"``); a scalar arg (a dim the kernel takes as a
    number) has ``value``, such an expression. The profiler evaluates them for sizes the user
    gives (``aotc profile --dim seq=128``)."""
    calls = _call_counts(mod)
    first = _first_calls(mod)
    table = []
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint in calls:
            args = [_arg(p) for p in func.params]
            symbolic = any(a["shape"] is None for a in args)
            if symbolic:
                _add_call_dims(args, first[gv.name_hint])
            # TVM counts a symbolic loop nest as if each symbolic extent were 1
            table.append({"name": _symbol(gv, func), "calls": calls[gv.name_hint],
                          "args": args, "flops": None if symbolic else _flops(func)})
    return sorted(table, key=lambda k: k["name"])


def _calls_kernel(call) -> bool:
    return call.op.same_as(_CALL_TIR) or call.op.same_as(_CALL_TIR_INPLACE)


def _call_counts(mod: tvm.IRModule) -> Counter:
    return Counter(call.args[0].name_hint for call in op_calls(mod) if _calls_kernel(call))


def entry_calls(mod: tvm.IRModule, entry: str) -> dict[str, int]:
    """Kernel name -> calls, for the kernels Relax function ``entry`` calls (kernels equal
    across entries are shared, so names do not tell)."""
    only = tvm.IRModule({gv: f for gv, f in mod.functions_items()
                         if gv.name_hint == entry or isinstance(f, tvm.tirx.PrimFunc)})
    names = {gv.name_hint: _symbol(gv, f) for gv, f in mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)}
    return {names.get(k, k): v for k, v in sorted(_call_counts(only).items())}


def _first_calls(mod: tvm.IRModule) -> dict:
    first = {}
    for call in op_calls(mod):
        if _calls_kernel(call):
            first.setdefault(call.args[0].name_hint, call)
    return first


def _add_call_dims(args: list[dict], call) -> None:
    """The call's view of each parameter (inputs, outputs, then the extra dims call_tir
    passes), in the calling function's dim names."""
    values = list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) else []
    out = call.ty
    values += list(out.fields) if isinstance(out, relax.TupleType) else [out]
    if len(call.args) > 2 and isinstance(call.args[2], relax.ShapeExpr):
        values += list(call.args[2].values)
    for arg, value in zip(args, values):
        if tvm.ir.is_prim_expr(value):  # a dim passed as a number
            arg["value"] = _dim(value)
            continue
        ty = getattr(value, "ty", value)
        if isinstance(ty, relax.TensorType) and ty.shape is not None:
            arg["dims"] = [_dim(d) for d in ty.shape.values]


def _dim(expr):
    return int(expr) if isinstance(expr, tvm.tirx.IntImm) else str(expr)


def _symbol(gv, func) -> str:
    """The name the kernel has in the library (its global_symbol, else the global var's)."""
    symbol = func.attrs.get("global_symbol") if func.attrs else None
    return str(symbol) if symbol else gv.name_hint


def _arg(param) -> dict:
    shape = getattr(param, "shape", None)
    dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in (shape or [])]
    static = shape is not None and all(d is not None for d in dims)
    return {"shape": dims if static else None, "dtype": str(getattr(param, "dtype", ""))}


FLOPS_ATTR = "aotc.flops"


def with_flops(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with its FLOP count attached. Counted before scheduling: a schedule may pad
    a kernel to whole tiles, and the padded work is not work the model asked for."""
    try:
        flops = int(tvm.s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))
    except (RuntimeError, TypeError, ValueError):  # TVM cannot count some loop nests
        return func
    return func.with_attr(FLOPS_ATTR, flops)


def _flops(func) -> int | None:
    flops = func.attrs.get(FLOPS_ATTR) if func.attrs else None
    return int(flops) if flops is not None else None
