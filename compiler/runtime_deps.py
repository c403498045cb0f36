"""A compiled model must run where only TVM's runtime is loaded: refuse kernels that call packed
functions which only TVM's compiler library registers.

Why: a TIR kernel may call a packed function by name (TOPI's CPU sort called
``tvm.contrib.sort.*``); the name is looked up when the kernel runs. In the compiling process
every function of ``libtvm_compiler.so`` is registered, so the model ran there and failed in
every other process. aotc replaces the kernels it knows of (SelfContainedKernels); this check
makes any other such call a compile error that names the kernel (or op) and the function.

How: a kernel's serialized form lists its string immediates; those that name a global function
registered here but not in a process that loaded only the runtime are the culprits. The
runtime's names come from one child process per compiling process, and only when some kernel
calls a packed function at all."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import tvm
from tvm import relax

from aotc.errors import CompileError, UnsupportedModelError

from .relax_walk import visit_functions

_PACKED_CALLS = ("tirx.tvm_call_packed", "tirx.tvm_call_cpacked")
# what a process has that loaded a model: TVM's runtime and the functions aotc's runtime
# registers (aotc.run_loop)
_LIST_RUNTIME_NAMES = (
    "from aotc.runtime._tvm_runtime import tvm_ffi\n"
    "from aotc.runtime import loops\n"
    "loops.register(tvm_ffi())\n"
    "print('\\n'.join(tvm_ffi().registry.list_global_func_names()))\n")


def packed_calls(func: tvm.tirx.PrimFunc) -> set[str]:
    """String immediates of a kernel that calls packed functions (the names among them)."""
    text = tvm.ir.save_json(func)
    if not any(op in text for op in _PACKED_CALLS):
        return set()
    nodes = json.loads(text)["nodes"]
    return {nodes[node["data"]["value"]]["data"] for node in nodes
            if node.get("type") == "ir.StringImm"}


@functools.lru_cache(maxsize=1)
def runtime_function_names() -> frozenset[str]:
    """Global functions registered in a process that loaded libtvm_runtime.so and no compiler."""
    result = subprocess.run([sys.executable, "-c", _LIST_RUNTIME_NAMES], capture_output=True,
                            text=True, timeout=120, check=True)
    return frozenset(result.stdout.split())


def check_runtime_only(mod: tvm.IRModule) -> None:
    """Raise CompileError if a kernel, or the graph itself (a Relax ``ExternFunc``), calls a
    packed function the runtime does not have."""
    _check_graph_calls(mod)
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        strings = packed_calls(func)
        registered = {s for s in strings
                      if tvm.get_global_func(s, allow_missing=True) is not None}
        missing = sorted(registered - runtime_function_names()) if registered else []
        if missing:
            raise CompileError(
                f"kernel {gv.name_hint} calls {missing}, registered only by TVM's compiler "
                "library: the model would run in this process and fail in any other. The op "
                "behind it needs a TIR kernel in aotc")


def _check_graph_calls(mod: tvm.IRModule) -> None:
    names: set[str] = set()
    visit_functions(mod, lambda expr: names.add(str(expr.global_symbol))
                    if isinstance(expr, relax.ExternFunc) else None)
    registered = {n for n in names if tvm.get_global_func(n, allow_missing=True) is not None}
    missing = sorted(registered - runtime_function_names()) if registered else []
    if missing:
        ops = sorted({_OPS_BY_FUNCTION.get(n, n) for n in missing})
        raise UnsupportedModelError(
            f"{', '.join(ops)}: TVM runs it through {missing}, which only TVM's compiler "
            "package registers (the model would fail in any other process); aotc has no "
            "kernel for it yet")


# TVM's Python implementations of Relax ops, by the op users know
_OPS_BY_FUNCTION = {"relax.run.unique": "Unique", "relax.run.nonzero": "NonZero",
                    "relax.run.print": "print", "relax.run.assert_op": "assert"}
# Relax ops that reach such a function and have no aotc kernel (what `aotc inspect` predicts)
COMPILER_ONLY_OPS = {"relax.unique": "Unique"}
