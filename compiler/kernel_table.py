"""The table of kernels a compiled model runs, embedded in its metadata for ``aotc profile``.

TVM 0.27 has no VM profiler (removed in v0.24), so the profiler calls each kernel of the
library on its own. For that it needs, per kernel: the argument shapes and dtypes, how often
the model calls it, and (for GFLOP/s) its floating-point operation count. All of it is known
only at compile time, from the scheduled module: it is recorded here."""

from __future__ import annotations

from collections import Counter

import tvm

from .relax_walk import op_calls

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def kernel_table(mod: tvm.IRModule) -> list[dict]:
    """One entry per PrimFunc the Relax functions call: name, calls, args, flops (None when
    TVM cannot count them). Args with a symbolic dim have ``shape: None``: the profiler skips
    those kernels."""
    calls = _call_counts(mod)
    table = []
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint in calls:
            table.append({"name": _symbol(gv, func), "calls": calls[gv.name_hint],
                          "args": [_arg(p) for p in func.params], "flops": _flops(func)})
    return sorted(table, key=lambda k: k["name"])


def _call_counts(mod: tvm.IRModule) -> Counter:
    return Counter(call.args[0].name_hint for call in op_calls(mod) if call.op.same_as(_CALL_TIR))


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
