"""The int8 compile, start to finish: the module up to the quantize phase, its sites minus the
skipped ones, calibration, and the ranges handed to the compile options. Returns what the
accuracy report needs afterwards (the calibration build, which doubles as the float32
reference)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aotc.errors import CompileError
from aotc.options import DYNAMIC, CompileOptions, QuantizeOptions

from ..contraction_sites import Site, main_sites
from ..pipeline import in_phase, run_phases
from . import samples as sample_io
from .calibrate import CalibrationRun, build_observed, calibrate
from .narrow_islands import narrow_islands

if TYPE_CHECKING:
    from tvm import relax


@dataclass
class Prepared:
    options: CompileOptions       # with int8_ranges
    run: CalibrationRun           # float32 model + activations
    sites: list[Site]             # the sites quantized
    skipped: dict[str, str]       # site -> why it stays float32
    evaluation: list[dict]        # samples for the accuracy report
    evaluated_on: str             # "held-out samples" | "calibration samples"


def chosen_sites(sites: list[Site], settings: QuantizeOptions,
                 func: relax.Function) -> tuple[list[Site], dict]:
    """(sites to quantize, {skipped site: why}); an unknown --skip-layers name is an error.
    Narrow convs of ``func`` (the function the sites are in) that no int8 layer follows stay
    float32 too (narrow_islands.py)."""
    names = [s.name for s in sites]
    unknown = [n for n in settings.skip_layers if n not in names]
    if unknown:
        raise CompileError(f"--skip-layers: no quantizable layer named {', '.join(unknown)}; "
                           f"this model's are: {', '.join(names) or 'none'}")
    skipped = {n: "--skip-layers" for n in settings.skip_layers}
    if settings.keep_first_last and sites:
        skipped.setdefault(names[0], "first layer kept in float32")
        skipped.setdefault(names[-1], "last layer kept in float32")
    for name, why in narrow_islands(func, sites).items():
        skipped.setdefault(name, why)
    if settings.calibration is None:  # int8-dynamic without samples: matmuls only
        for site in sites:
            if not _dynamic(site, settings):
                skipped.setdefault(site.name, "no calibration samples")
    return [s for s in sites if s.name not in skipped], skipped


def _dynamic(site: Site, settings: QuantizeOptions) -> bool:
    """Whether the site's activation range is measured per run (int8-dynamic matmuls)."""
    return settings.mode == "int8-dynamic" and site.call.op.name == "relax.matmul"


def _report_samples(settings: QuantizeOptions, calibration: list[dict], signature):
    """(samples, what they are) for the accuracy report."""
    from aotc.runtime.inputs import random_inputs
    if settings.evaluation is not None:
        return sample_io.read_samples(settings.evaluation, signature), "held-out samples"
    if calibration:
        return calibration, "calibration samples"
    return [random_inputs(signature, seed=k) for k in range(4)], "random inputs"


def host_twin(spec):
    """``spec`` when its code runs natively here, else this host's target: calibration and the
    accuracy report run the model, so for ARM or CUDA targets they run a host build of it (the
    int8 arithmetic is integer sums: the same on every target)."""
    import platform

    from aotc.targets import resolve
    if spec.arch == platform.machine() and spec.runtime_device == "cpu":
        return spec
    return resolve("x86")


def prepare(imported, spec, target, options: CompileOptions, settings: QuantizeOptions,
            finalize, say: Callable[[str], None]) -> Prepared:
    import tvm
    mod = in_phase("optimize", lambda: run_phases(imported.mod, spec, target, options,
                                                  stop_before="quantize"))
    sites, skipped = chosen_sites(main_sites(mod), settings, mod["main"])
    if not sites:
        raise CompileError("--quantize int8: the model has no conv2d or matmul with constant "
                           "weights that int8 can take" + (" (all skipped)" if skipped else ""))
    input_names = imported.signature.input_names()
    calibration = ([] if settings.calibration is None else
                   sample_io.read_samples(settings.calibration, imported.signature))
    evaluation, evaluated_on = _report_samples(settings, calibration, imported.signature)
    static = [s for s in sites if not _dynamic(s, settings)]
    say(f"calibration build: {len(sites)} int8 layers ({len(sites) - len(static)} dynamic), "
        f"{len(calibration)} samples")
    here = host_twin(spec)
    run = in_phase("calibration build", lambda: build_observed(
        mod, sites, input_names, here, tvm.target.Target(here.tvm_target), options, finalize))
    ranges = {s.name: DYNAMIC for s in sites if _dynamic(s, settings)}
    if static:
        ranges.update(calibrate(run, static, calibration, settings.method, settings.percentile,
                                say))
    options = dataclasses.replace(options, int8_ranges=ranges)
    return Prepared(options, run, sites, skipped, evaluation, evaluated_on)


def evaluate(prepared: Prepared, model_path, settings: QuantizeOptions,
             say: Callable[[str], None]) -> dict:
    """The accuracy report (report.py) of the compiled int8 model at ``model_path``."""
    from aotc.runtime import load

    from .calibrate import owner_of
    from .report import layer_errors, output_errors
    say(f"accuracy: int8 vs float32 on {len(prepared.evaluation)} {prepared.evaluated_on}")
    model = load(model_path)
    names = [o.name for o in model.signature.outputs]
    reference, quantized = [], []
    for feed in prepared.evaluation:
        reference.append(prepared.run.run(feed)[0])
        outputs = model.run(feed)
        quantized.append([outputs[n] for n in names])
    ranges = prepared.options.int8_ranges
    owners = owner_of(prepared.run, prepared.sites)
    return {"mode": settings.mode, "method": settings.method,
            "samples": len(prepared.evaluation), "evaluated_on": prepared.evaluated_on,
            "int8_layers": len(prepared.sites), "float32_layers": prepared.skipped,
            "calibrated_layers": sum(r != DYNAMIC for r in ranges.values()),
            "outputs": output_errors(names, reference, quantized),
            "layers": layer_errors(prepared.run, prepared.sites, ranges, prepared.evaluation,
                                   owners)}
