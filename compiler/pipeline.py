"""The compile pipeline: a list of passes per phase, run under the target.

Phases (names are what --dump-ir writes):
  simplify  run-time slices lowered early (a FoldConstant bug), inference-only decomposition
            (BatchNorm -> scale/shift), constant folding, per-channel scale/shift folded into
            conv/matmul weights, and our clean-up of importer output that would block layout
            conversion
  layout    conv2d to NHWC data / HWIO weights: the channel axis becomes innermost in both, which
            is what the CPU schedules vectorize; folding then pre-transposes the weights
  lower     indices of gathers/scatters normalized and range-checked (GuardIndices), float16/
            bfloat16 accumulation moved to float32 (HalfInFloat32), then Relax ops -> TIR
            PrimFuncs (max/min with infinite identities, exp/erf/tanh/sigmoid as vectorizable
            polynomials), fused (one fused kernel = one tuning task)
  schedule  a schedule for every PrimFunc (compiler/lower); empty constants made at run time
            (TVM cannot load zero-size constants)
  finalize  TVM's dataflow lowering and memory planning (tvm.compile does the rest)
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import tvm
from tvm import relax

from aotc.errors import CompileError, meaningful_line
from aotc.targets import TargetSpec

from .lower import default_schedule_pass
from .lower.exact_minmax import LEGALIZE_MAP as EXACT_MINMAX
from .lower.vector_math import LEGALIZE_MAP as VECTOR_MATH
from .passes import (ConvertLayoutNHWC, FoldChannelAffine, GuardIndices, HalfInFloat32,
                     LegalizeDynamicSlices, LiftMinMaxCallTIR, MaterializeEmptyConstants,
                     RemoveIdentityBroadcast, RemoveInferenceDropout, SumOfStackToAdd)


def phases(spec: TargetSpec) -> list[tuple[str, list[tvm.transform.Pass]]]:
    return [
        ("simplify", [LegalizeDynamicSlices(),  # before any FoldConstant: see its docstring
                      relax.transform.DecomposeOpsForInference(),
                      relax.transform.FoldConstant(),
                      FoldChannelAffine(),
                      LiftMinMaxCallTIR(),
                      SumOfStackToAdd(),
                      RemoveIdentityBroadcast(),
                      RemoveInferenceDropout()]),
        ("layout", [ConvertLayoutNHWC(), relax.transform.FoldConstant()]),
        ("lower", [GuardIndices(),
                   HalfInFloat32(),
                   # sort, top-k, cumsum/cumprod and sampling to TOPI kernels, as TVM's CPU
                   # pipeline does before legalization (without: "CodeGenVM cannot emit").
                   relax.backend.DispatchSampling(),
                   relax.backend.DispatchSortScan(),
                   relax.transform.LegalizeOps({**EXACT_MINMAX, **VECTOR_MATH}),
                   relax.transform.AnnotateTIROpPattern(),
                   relax.transform.FoldConstant(),
                   relax.transform.FuseOps(),
                   relax.transform.FuseTIR()]),
        ("schedule", [default_schedule_pass(spec),
                      MaterializeEmptyConstants()]),  # after the last FoldConstant
    ]


def run_phases(mod: tvm.IRModule, spec: TargetSpec, target: tvm.target.Target,
               dump_dir: Path | None = None,
               on_phase: Callable[[str], None] | None = None) -> tvm.IRModule:
    """Run every phase; optionally write the IR after each to ``dump_dir/NN_phase.py``. A
    failure is a CompileError naming the phase (simplify, layout, lower, schedule)."""
    if dump_dir:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / "00_imported.py").write_text(mod.script(show_meta=False))
    with target:
        for index, (name, passes) in enumerate(phases(spec), start=1):
            if on_phase:
                on_phase(name)
            sequence = tvm.transform.Sequential(passes, name=f"aotc.{name}")
            mod = in_phase(name, lambda: sequence(mod))  # pylint: disable=cell-var-from-loop
            if dump_dir:
                (dump_dir / f"{index:02d}_{name}.py").write_text(mod.script(show_meta=False))
    return mod


def in_phase(name: str, work: Callable[[], object]):
    """``work()``; a failure becomes a CompileError that names the phase. TVM errors carry
    long C++ traces: the meaningful line is kept. A CompileError from an inner phase passes
    through as it is."""
    try:
        return work()
    except CompileError:
        raise
    except Exception as err:  # pylint: disable=broad-except
        raise CompileError(f"compile phase {name!r} failed: "
                           f"{meaningful_line(err) or type(err).__name__}") from err
