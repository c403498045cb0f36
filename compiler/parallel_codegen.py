"""``relax.build`` with the kernels compiled on every allowed core.

TVM lowers and compiles a model's PrimFuncs as one LLVM module on one thread. Here the VM
codegen runs as in ``relax.build``; the PrimFuncs are then dealt into one IRModule per worker
and each is lowered and compiled by ``tvm.tirx.build`` on its own thread (TVM's FFI releases
the GIL for the call). The first library imports the others; ``export_library`` writes each
as an object file and links them into the one ``.so`` (TVM's context symbols are link-once,
so the objects link together). Pass context and target are thread-local in TVM, so each
worker enters the caller's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import tvm
from tvm import relax
from tvm.relax import vm_build

from aotc.settings import default_threads


def build(mod: tvm.IRModule, target: tvm.target.Target, relax_pipeline: tvm.transform.Pass,
          workers: int | None = None) -> relax.VMExecutable:
    """What ``relax.build(mod, target, relax_pipeline=relax_pipeline)`` returns, with the
    TIR compiled by ``workers`` threads (default: the cores this process may use)."""
    with target:
        mod = relax_pipeline(mod)
    attrs = dict(mod.attrs) if mod.attrs else {}
    ext_libs = list(attrs.get("external_mods", []))
    params = dict(attrs.get("const_name_to_constant", {}))
    builder = relax.ExecBuilder()
    tir_mod = vm_build._filter_tir(vm_build._vmcodegen(builder, mod, "bytecode"))
    groups = split(tir_mod, workers or default_threads())
    context = tvm.transform.PassContext.current()

    def compile_group(group: tvm.IRModule) -> tvm.runtime.Module:
        with context, target:
            return tvm.tirx.build(group, target=target, pipeline="default")

    if len(groups) <= 1:  # none: a model with no kernels (an identity, a constant)
        libs = [compile_group(g) for g in groups]
    else:
        with ThreadPoolExecutor(len(groups)) as pool:
            libs = list(pool.map(compile_group, groups))
    lib = libs[0] if libs else None
    for other in libs[1:]:
        lib.import_module(other)
    device = [m for m in ext_libs if vm_build._is_device_module(m)]
    host = [m for m in ext_libs if not vm_build._is_device_module(m)]
    for module in device:
        lib.import_module(module)
    return relax.VMExecutable(vm_build._ffi_api.VMLink(builder, target, lib, host, params))


# Each LLVM module costs its own set-up, object file and link input: a model with a handful of
# kernels compiles in less CPU time as one module, and no sooner as two.
MIN_KERNELS_PER_GROUP = 4


def split(tir_mod: tvm.IRModule | None, workers: int) -> list[tvm.IRModule]:
    """The PrimFuncs dealt in turn into at most ``workers`` modules (module attributes kept).
    Dealt, not packed by size: TVM 0.27's Python has no TIR visitor to measure a function
    cheaply, and a model's kernels are many and alike enough for turns to balance."""
    if tir_mod is None or not tir_mod.functions:
        return []
    funcs = sorted(tir_mod.functions_items(), key=lambda item: item[0].name_hint)
    count = max(1, min(workers, len(funcs) // MIN_KERNELS_PER_GROUP))
    return [tvm.IRModule(dict(funcs[i::count]), attrs=tir_mod.attrs) for i in range(count)]
