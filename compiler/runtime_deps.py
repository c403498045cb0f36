"""A compiled model must run where only TVM's runtime is loaded: refuse kernels that call packed
functions which only TVM's compiler library registers.

Why: a TIR kernel may call a packed function by name (TOPI's CPU sort called
``tvm.contrib.sort.*``); the name is looked up when the kernel runs. In the compiling process
every function of ``libtvm_compiler.so`` is registered, so the model ran there and failed in
every other process. aotc replaces the kernels it knows of (SortToTIR); this check makes any
other such call a compile error that names the kernel and the function.

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

from aotc.errors import CompileError

_PACKED_CALLS = ("tirx.tvm_call_packed", "tirx.tvm_call_cpacked")
_LIST_RUNTIME_NAMES = (
    "from aotc.runtime._tvm_runtime import tvm_ffi\n"
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
    """Raise CompileError if a kernel calls a packed function the runtime does not have."""
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
