"""The compile pipeline: a list of passes per phase, run under the target.

Phases (names are what --dump-ir and --explain print):
  simplify  run-time slices lowered early (a FoldConstant bug), inference-only decomposition
            (BatchNorm -> scale/shift), constant folding, per-channel scale/shift folded into
            conv/matmul weights, and our clean-up of importer output that would block layout
            conversion (passes/folding, passes/importer_fixes); layout chains collapsed, zero
            padding folded into convolutions, common subexpressions shared (passes/cleanup)
  layout    conv2d to NHWC data / HWIO weights: the channel axis becomes innermost in both, which
            is what the CPU schedules vectorize; folding then pre-transposes the weights
            (passes/layout)
  fuse      patterns TVM's FuseOps does not find (passes/fusion)
  quantize  with --quantize int8: calibrated contractions marked in quantize/dequantize form,
            then realized as int8 kernels with prepacked weights (compiler/quantize); right
            after fusion so that combined projections are one int8 kernel, and before
            lowering, whose FoldConstant would fold the weights' dequantize away; with
            --precision bf16, large-weight contractions as bf16 kernels; with --precision fp16,
            the contractions as float16 kernels
  pack      float32 3x3 stride-1 convs with enough output tiles as Winograd F(4x4)/F(2x2)
            kernels (passes/layout/winograd_conv.py), the float32 conv/matmul weights left
            prepacked in the blocked order the kernels read (passes/layout/prepack_weights.py)
  lower     indices of gathers/scatters normalized and range-checked (GuardIndices), float16/
            bfloat16 accumulation moved to float32 (HalfInFloat32), then Relax ops -> TIR
            PrimFuncs (max/min with infinite identities; exp/erf/tanh/sigmoid as vectorizable
            polynomials: VectorMath), fused (one fused kernel = one tuning task) (passes/lowering)
  schedule  a schedule for every PrimFunc (compiler/default_schedules); empty constants made at run
  time
            (TVM cannot load zero-size constants)
  finalize  TVM's dataflow lowering and memory planning (compiler/build.py; tvm.compile)

Each pass has a level (CompileOptions.opt_level runs those at or below it) or is required:
correctness or loading needs it, and it cannot be disabled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import tvm

from aotc.errors import AotcError, CompileError, meaningful_line
from aotc.options import CompileOptions
from aotc.targets import TargetSpec, amx_bf16, broadcast_register, simd

from . import passes
from . import quantize as int8
from .default_schedules import default_schedule_pass
from .explain import Explanation, PassRecord, kernel_count, op_counts
from .passes.lowering import VECTOR_MATH_LEVEL, VECTOR_MATH_NAME
from .passes.step import REQUIRED, Step, enabled


def simplify(_options: CompileOptions) -> list[Step]:
    return passes.folding.steps() + passes.importer_fixes.steps() + passes.cleanup.steps()


def layout(_options: CompileOptions) -> list[Step]:
    return passes.layout.steps()


def fuse(_options: CompileOptions) -> list[Step]:
    return passes.fusion.steps()


def quantize(spec: TargetSpec):
    return lambda options: int8.steps(options, bool(amx_bf16(spec.tvm_target)))


def pack(spec: TargetSpec):
    lanes = spec.vector_lanes(32) if spec.schedule_rules == "cpu" else None
    broadcast = lanes is not None and broadcast_register(spec.tvm_target)
    registers = simd(spec.tvm_target)[1] if lanes is not None else 32
    return lambda _options: passes.layout.pack_steps(lanes, broadcast, registers)


def lower(options: CompileOptions) -> list[Step]:
    return passes.lowering.steps(options)


def schedule(spec: TargetSpec):
    def steps(_options: CompileOptions) -> list[Step]:
        # CPU kernels: lane-guarded vector loops run whole vectors where they can; tile
        # intrinsics that sum from zero write no zeros first and load their configuration
        # once per task; pad kernels' producers write the padded rows themselves, and convs'
        # producers their padded image
        vectors = [Step(passes.WholeVectorPredicates(), 1),
                   Step(passes.DropOverwrittenInits(), 1),
                   Step(passes.HoistTileConfigs(), 1),
                   Step(passes.PaddedRowsInProducer(), 1),
                   Step(passes.PaddedImageInProducer(), 1)] if spec.schedule_rules == "cpu" else []
        return [Step(default_schedule_pass(spec, _options.schedules), 1), *vectors,
                # after the last FoldConstant, so that nothing folds the result back
                Step(passes.MaterializeEmptyConstants(), REQUIRED,
                     "TVM cannot load empty constants")]
    return steps


def phase_steps(spec: TargetSpec, options: CompileOptions) -> list[tuple[str, list[Step]]]:
    return [("simplify", simplify(options)), ("layout", layout(options)),
            ("fuse", fuse(options)), ("quantize", quantize(spec)(options)),
            ("pack", pack(spec)(options)), ("lower", lower(options)),
            ("schedule", schedule(spec)(options))]


def phases(spec: TargetSpec, options: CompileOptions | None = None
           ) -> list[tuple[str, list[tvm.transform.Pass]]]:
    """The passes that run, per phase, for ``options`` (checked: see check_options)."""
    options = options or CompileOptions()
    check_options(spec, options)
    return [(phase, [s.pass_ for s in steps if enabled(s.name, s.level, options)])
            for phase, steps in phase_steps(spec, options)]


def skipped_steps(spec: TargetSpec, options: CompileOptions) -> list[tuple[str, str, str]]:
    """(phase, pass, why) for every pass these options leave out."""
    out = []
    for phase, steps in phase_steps(spec, options):
        for step in steps:
            if not enabled(step.name, step.level, options):
                out.append((phase, step.name, "disabled" if step.name in options.disabled_passes
                            else f"needs --opt-level {step.level}"))
    if not enabled(VECTOR_MATH_NAME, VECTOR_MATH_LEVEL, options):
        out.append(("lower", VECTOR_MATH_NAME, "libm exp/erf/tanh instead"))
    return out


def check_options(spec: TargetSpec, options: CompileOptions) -> None:
    """Unknown or required pass names in ``disabled_passes`` are errors, named."""
    steps = {s.name: s for _, group in phase_steps(spec, CompileOptions()) for s in group}
    for name in options.disabled_passes:
        if name == VECTOR_MATH_NAME:
            continue
        if name not in steps:
            known = sorted({n for n, s in steps.items() if s.level is not REQUIRED}
                           | {VECTOR_MATH_NAME})
            raise CompileError(f"--disable-pass {name}: no such pass; passes that can be "
                               f"disabled: {', '.join(known)}")
        if steps[name].level is REQUIRED:
            raise CompileError(f"--disable-pass {name}: this pass cannot be disabled "
                               f"({steps[name].why_required})")


def run_phases(mod: tvm.IRModule, spec: TargetSpec, target: tvm.target.Target,
               options: CompileOptions | None = None,
               on_phase: Callable[[str], None] | None = None,
               explanation: Explanation | None = None,
               stop_before: str | None = None, start_at: str | None = None) -> tvm.IRModule:
    """Run every phase, pass by pass. With ``options.dump_ir``, write the IR after each pass
    to ``NN_phase_Pass.py``; with ``explanation``, record what each pass changed. A failure is
    a CompileError naming the phase (simplify, layout, fuse, lower, schedule). With
    ``stop_before``, the module as that phase would receive it (the tuner takes its kernels
    from just before "schedule"). With ``start_at``, the phases before it are skipped (the
    module already went through them: calibration builds its module from mid-pipeline)."""
    options = options or CompileOptions()
    dump = _dumper(options.dump_ir)
    dump("imported", "", mod)
    if explanation is not None:
        explanation.skipped.extend(skipped_steps(spec, options))
    started = start_at is None
    with target:
        for name, phase_passes in phases(spec, options):
            if name == stop_before:
                break
            started = started or name == start_at
            if not started:
                continue
            if on_phase:
                on_phase(name)
            for pass_ in phase_passes:
                mod = in_phase(name, lambda p=pass_, m=mod, n=name: _run_pass(p, m, n, explanation))
                dump(name, pass_.info.name, mod)
    return mod


def _run_pass(pass_, mod, phase: str, explanation: Explanation | None):
    if explanation is None:
        return pass_(mod)
    before, kernels = op_counts(mod), kernel_count(mod)
    start = time.perf_counter()
    out = pass_(mod)
    explanation.records.append(PassRecord(phase, pass_.info.name, time.perf_counter() - start,
                                          before, op_counts(out), kernels, kernel_count(out)))
    return out


def _dumper(folder: Path | None):
    counter = iter(range(1000))
    if folder is None:
        return lambda *_args: None
    folder.mkdir(parents=True, exist_ok=True)

    def dump(phase: str, pass_name: str, mod: tvm.IRModule) -> None:
        stem = "_".join(part for part in (f"{next(counter):02d}", phase, pass_name) if part)
        (folder / f"{stem}.py").write_text(mod.script(show_meta=False))
    return dump


def in_phase(name: str, work: Callable[[], object]):
    """``work()``; a failure becomes a CompileError that names the phase. TVM errors carry
    long C++ traces: the meaningful line is kept. A CompileError from an inner phase passes
    through as it is, as does any other named aotc error (an op refused with its reason)."""
    try:
        return work()
    except AotcError:
        raise
    except Exception as err:
        raise CompileError(f"compile phase {name!r} failed: "
                           f"{meaningful_line(err) or type(err).__name__}") from err
