"""Build and export: scheduled Relax module -> one .so with the metadata and hash inside."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tvm
from tvm import relax
from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline
from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.support import cc

from aotc.atomic import replacing
from aotc.errors import CompileError, TargetError
from aotc.options import CompileOptions
from aotc.runtime import artifact
from aotc.settings import default_threads
from aotc.targets import TargetSpec, amx_bf16, amx_int8, cpu_flags_needed, runs_here, x86

from . import buckets, cuda_codegen, kv_cache, parallel_codegen
from .default_schedules import tuned_functions, tuning_share, unscheduled_functions
from .explain import Explanation
from .frontends import ImportedModel
from .kernel_table import entry_calls, kernel_table
from .memory_report import memory_report
from .packed_imports import imports_packer, write_blob
from .passes.lowering import OrderShapeFuncStores
from .pipeline import in_phase, run_phases
from .runtime_deps import check_runtime_only

Progress = Callable[[str], None]


def versions() -> dict:
    return {pkg: importlib.metadata.version(pkg)
            for pkg in ("aotc", "apache-tvm", "apache-tvm-ffi")}


def build_time() -> int:
    """The build's Unix time: ``SOURCE_DATE_EPOCH`` where set (reproducible-builds.org's
    convention, so that the same inputs give the same ``.so`` bit for bit), else now."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is None:
        return int(time.time())
    if not epoch.isdigit():
        raise CompileError(f"SOURCE_DATE_EPOCH must be a non-negative integer, not {epoch!r}")
    return int(epoch)


def _prepare_cuda(spec: TargetSpec) -> None:
    # PTX too (the generic preset): the driver compiles it for GPUs newer than the arch
    cuda_codegen.prepare(spec.tvm_target["arch"], with_ptx="ptx" in spec.features)


# TargetSpec.backend -> (TVM's backend pipeline module, what codegen needs first). Only its
# post-scheduling passes run: its default pipeline would legalize and fuse again, which we
# have done.
FINALIZE = {"cpu": (cpu_pipeline, lambda spec: None),
            "cuda": (cuda_pipeline, _prepare_cuda)}


def finalize_pipeline(spec: TargetSpec, target: tvm.target.Target) -> tvm.transform.Pass:
    pipeline, prepare = FINALIZE[spec.backend]
    prepare(spec)
    return tvm.transform.Sequential(pipeline.dataflow_lower_passes(target)
                                    + pipeline.finalize_passes(target)
                                    + [OrderShapeFuncStores()])


def check_toolchain(spec: TargetSpec) -> None:
    """Fail before the slow phases when the target's linker is not installed."""
    missing = spec.toolchain.missing()
    if missing:
        raise TargetError(f"target {spec.name}: cannot link the .so: {missing}")


def _fcompile(spec: TargetSpec):
    """The linker of the target's toolchain (TVM's default, the host cc, when it has none)."""
    if spec.toolchain.compiler is None:
        return None
    check_toolchain(spec)
    return cc.cross_compiler(spec.toolchain.compiler, options=list(spec.toolchain.link_flags))


def build(model: ImportedModel, spec: TargetSpec, output: str | Path,
          options: CompileOptions | None = None, progress: Progress | None = None) -> dict:
    """Compile ``model`` for ``spec`` into ``output``; returns the embedded metadata (plus,
    with ``options.explain``, an ``explain`` entry that is not embedded)."""
    options = options or CompileOptions()
    say = progress or (lambda _msg: None)
    target = tvm.target.Target(spec.tvm_target)
    start = time.perf_counter()
    explanation = Explanation() if options.explain else None
    mod = in_phase("optimize", lambda: run_phases(model.mod, spec, target, options,
                                               lambda p: say(f"phase {p}"), explanation))
    bucket_table = generation = None
    if options.buckets and options.kv_capacity:
        raise CompileError("--buckets and --kv-capacity do not combine: a decoder's decode "
                           "entry is already static")
    if options.buckets:
        mod, bucket_table = _add_buckets(model, mod, spec, target, options, say)
    if options.kv_capacity:
        mod, generation = _add_kv_cache(model, mod, spec, target, options, say)
    in_phase("runtime check", lambda: check_runtime_only(mod))
    say("phase codegen (LLVM)")
    codegen_start = time.perf_counter()
    # CPU kernels compile on every allowed core; CUDA builds keep TVM's single module (its
    # device code is one fatbin per build).
    codegen = parallel_codegen.build if spec.backend == "cpu" else (
        lambda m, t, pipeline: relax.build(m, t, relax_pipeline=pipeline))
    executable = in_phase("codegen", lambda: codegen(mod, target,
                                                     finalize_pipeline(spec, target)))
    if explanation is not None:
        explanation.later_phases["codegen"] = time.perf_counter() - codegen_start
    metadata = {
        "signature": model.signature.to_json(),
        "target": {"name": spec.name, "family": spec.family, "tvm": spec.tvm_target,
                   "arch": spec.arch, "device": spec.runtime_device,
                   "cpu_flags": cpu_flags_needed(spec.tvm_target)},
        "versions": versions(),
        "source": Path(model.source).name,
        "opt_level": options.opt_level,
        "precision": options.precision,
        "disabled_passes": list(options.disabled_passes),
        "unscheduled_kernels": unscheduled_functions(mod),
        "tuned_kernels": tuned_functions(mod),
        "memory": in_phase("memory report", lambda: memory_report(mod, target)),
        "kernels": kernel_table(mod),
        "built_unix_time": build_time(),
    }
    metadata["tuning"] = tuning_share(mod, metadata["kernels"])
    if options.int8_ranges:
        metadata["quantization"] = {"mode": "int8", "layers": sorted(options.int8_ranges)}
    if generation is not None:
        generation["kernels"] = {name: entry_calls(mod, function) for name, function in
                                 {**generation["entries"], "main": "main"}.items()}
        metadata["generation"] = generation
    if bucket_table is not None:
        if spec.runtime_device == "cpu" and runs_here(spec) is None:
            say("timing the buckets against the symbolic entry")
            bucket_table["symbolic_cost"] = in_phase("buckets", lambda: _bucket_costs(
                executable, metadata, model.signature, bucket_table, spec))
        metadata["buckets"] = bucket_table
    say("phase export")
    export_start = time.perf_counter()
    in_phase("export", lambda: _export(executable, Path(output), metadata, spec))
    if bucket_table is not None:
        say("checking the buckets' padding")
        _keep_if_right(output, lambda: buckets.verify_padding(output, model.signature,
                                                              bucket_table))
    if generation is not None and spec.runtime_device == "cpu" and runs_here(spec) is None:
        say("checking the KV-cache entries against the model")
        _keep_if_right(output, lambda: in_phase("kv cache", lambda: kv_cache.verify(
            output, model.signature, generation, options.precision)))
    if explanation is not None:
        explanation.later_phases["export"] = time.perf_counter() - export_start
    metadata["compile_seconds"] = round(time.perf_counter() - start, 2)
    if explanation is not None:
        explanation.memory = metadata["memory"]
        metadata["explain"] = {"table": explanation.table(), **explanation.to_json()}
    return metadata


def _bucket_costs(executable, metadata: dict, signature, table: dict,
                  spec: TargetSpec) -> dict[str, float]:
    """buckets.symbolic_costs, measured on a library exported for the purpose (the final one
    embeds the costs, so it is written after them)."""
    with tempfile.TemporaryDirectory(prefix="aotc-buckets-") as tmp:
        probe = Path(tmp) / "probe.so"
        _export(executable, probe, {**metadata, "buckets": table}, spec)
        return buckets.symbolic_costs(probe, signature, table)


def _keep_if_right(output, check: Callable[[], None]) -> None:
    """Run ``check`` on the written library; remove the library when it fails (it would
    answer wrongly) and raise the failure."""
    try:
        check()
    except Exception:
        Path(output).unlink(missing_ok=True)
        raise


def _entry_options(options: CompileOptions, entry: str) -> CompileOptions:
    """The options an extra entry's optimization runs with: its IR dumps go to a folder of
    their own inside ``--dump-ir`` (they would overwrite the main entry's files)."""
    if options.dump_ir is None:
        return options
    return dataclasses.replace(options, dump_ir=options.dump_ir / entry)


def _add_buckets(model: ImportedModel, mod, spec: TargetSpec, target, options: CompileOptions,
                 say: Progress):
    """The symbolic module merged with one optimized module per bucket combination; returns
    (module, the bucket table the runtime dispatches with)."""
    buckets.check_buckets(options.buckets, model.signature, model.source)
    modules = {"": mod}
    table = {"dims": {k: sorted(v) for k, v in options.buckets.items()}, "entries": {},
             "sizes": {}}
    for sizes in buckets.combinations(options.buckets):
        say(f"bucket {sizes}")
        name = buckets.entry_name(sizes)
        modules[name[len("main"):]] = in_phase("optimize", lambda s=sizes, n=name: run_phases(
            buckets.specialize(model.mod, s), spec, target, _entry_options(options, n)))
        key = ",".join(f"{k}={v}" for k, v in sorted(sizes.items()))
        table["entries"][key], table["sizes"][key] = name, sizes
    return in_phase("buckets", lambda: buckets.merge(modules)), table


def _add_kv_cache(model: ImportedModel, mod, spec: TargetSpec, target,
                  options: CompileOptions, say: Progress):
    """The module merged with the optimized prefill and decode entries (compiler/kv_cache);
    returns (module, the generation table the runtime reads)."""
    capacity = kv_cache.round_capacity(options.kv_capacity)
    roles = kv_cache.find_roles(model.mod, model.signature, model.source)
    modules = {"": mod}
    for name, entry in kv_cache.entries(model.mod, model.signature, roles, capacity).items():
        say(f"KV-cache entry {name} (capacity {capacity})")
        modules["_" + name] = in_phase("optimize", lambda m=entry, n=name: run_phases(
            m, spec, target, _entry_options(options, "main_" + n)))
    generation = kv_cache.table(model.signature, roles, capacity)
    generation["entries"] = {name: "main_" + name for name in ("prefill", "decode")}
    return in_phase("kv cache", lambda: buckets.merge(modules)), generation


def _export(executable, output: Path, metadata: dict, spec: TargetSpec) -> None:
    """Link the library straight into a temporary file beside ``output`` (no copy of a
    model's weights from a staging folder) and move it into place once sealed."""
    fcompile = _fcompile(spec)
    with tempfile.TemporaryDirectory(prefix="aotc-") as tmp, replacing(output) as staging:
        metadata_file = write_blob(artifact.metadata_blob(metadata), "aotc_metadata",
                                   spec.arch, tmp, "aotc_metadata")
        addons = [metadata_file]
        if amx_bf16(spec.tvm_target) or amx_int8(spec.tvm_target):  # kernels may use AMX
            addons.append(os.path.join(tmp, "aotc_amx.c"))
            Path(addons[-1]).write_text(x86.AMX_PERMISSION_SOURCE, encoding="ascii")
        export_library(executable, str(staging), addons, tmp, fcompile,
                       imports_packer(spec.arch))
        artifact.seal(staging)


def export_library(executable, path: str, addons: list[str], workspace: str, fcompile,
                   fpack_imports) -> None:
    """``executable.export_library``, with the kernels' object files written in parallel.

    Writing an LLVM module's object file runs LLVM's code generation for it, and TVM writes
    the modules one after the other: with the kernels split over several modules
    (parallel_codegen.py), that was most of the export. Here each goes on its own thread (TVM's
    FFI releases the GIL for the call), under the names TVM gives them, and the link is TVM's:
    the objects, then the packed imports, through ``fcompile`` (the host cc by default).
    Modules other than LLVM ones (C sources) take TVM's own export."""
    root = executable.mod
    modules = root._collect_dso_modules()
    if not modules or any(module.kind != "llvm" for module in modules):
        extra = {"fcompile": fcompile} if fcompile is not None else {}
        executable.export_library(path, addons=addons, fpack_imports=fpack_imports,
                                  workspace_dir=workspace, **extra)
        return
    if any(module.get_function("__tvm_is_system_module")() for module in modules):
        raise CompileError("aotc builds shared libraries only (no system-lib modules)")
    suffix = getattr(fcompile, "object_format", "o")
    objects = [os.path.join(workspace, f"lib{index}.{suffix}") for index in range(len(modules))]
    with ThreadPoolExecutor(max(1, min(len(modules), default_threads()))) as pool:
        list(pool.map(lambda module, file: module.write_to_file(file), modules, objects))
    files = [*addons, *objects]
    if root.imports:
        files.append(fpack_imports(root, False, "", workspace))
    (fcompile or cc.create_shared)(path, files)
