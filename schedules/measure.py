"""Time one kernel as it would run in a model, and check that a tuned kernel computes what the
default one does.

Built alone for the target, random float inputs (zeros for integer ones, so that gathers stay
in range), median of repeats. Used to compare a tuned schedule with the default rules' one,
both timed here in the same way. MetaSchedule's runner times candidates but never looks at
their results: the tuner compares a candidate's values with the default's on the same
arguments (``same_values``) before it is logged, so a schedule that computes something else
is never kept."""

from __future__ import annotations

import numpy as np
import tvm

from aotc.measure_settings import TUNE, MeasureSettings


def measured_seconds(*results) -> float | None:
    """Median run time of a measured candidate, from its builder and runner results (or a
    database record); None when a build or run failed or nothing was timed. (The tuner's
    runners report the median alone: runners.MedianRunner; older records carry every
    repeat.)"""
    if any(getattr(result, "error_msg", None) for result in results):
        return None
    run_secs = results[-1].run_secs
    if not run_secs:
        return None
    return float(np.median([float(s) for s in run_secs]))


def kernel_seconds(func: tvm.tirx.PrimFunc, target: tvm.target.Target,
                   settings: MeasureSettings = TUNE) -> float:
    return kernel_timer(func, target, settings)(kernel_arguments(func))


def kernel_timer(func: tvm.tirx.PrimFunc, target: tvm.target.Target,
                 settings: MeasureSettings = TUNE):
    """``func`` built once; the returned ``time(args)`` gives the median of one measurement
    as ``settings`` say (retime.py times several kernels this way, in turn)."""
    timer = build_kernel(func, target).time_evaluator("main", tvm.cpu(),
                                                      **evaluator_arguments(settings))
    return lambda args: float(np.median(timer(*args).results))


def evaluator_arguments(settings: MeasureSettings) -> dict:
    """time_evaluator's keyword arguments for ``settings`` (here and on a farm's device)."""
    return {"number": settings.number, "repeat": settings.repeat,
            "min_repeat_ms": settings.min_repeat_ms,
            "f_preproc": "cache_flush_cpu_non_first_arg" if settings.cache_flush else ""}


def kernel_outputs(func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> list[np.ndarray]:
    """Every argument's values after one run on the seeded random inputs (outputs included)."""
    args = kernel_arguments(func)
    build_kernel(func, target)["main"](*args)
    return [a.numpy() for a in args]


def same_values(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-3) -> bool:
    """Whether two kernels left the same values in every argument (``kernel_outputs``, here
    or on a farm's device; outputs included), within ``rtol`` of the largest magnitude of
    each (a schedule may reorder float sums). The tuner runs the default once and compares
    each candidate's values with its values this way."""
    for got_values, want_values in zip(got, want):
        scale = max(1.0, float(np.max(np.abs(want_values)))) if want_values.size else 1.0
        if got_values.shape != want_values.shape or not np.allclose(
                got_values, want_values, rtol=rtol, atol=rtol * scale, equal_nan=True):
            return False
    return True


def task_module(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    """The kernel as MetaSchedule tunes and replays it, and as it is built here: alone, named
    ``main`` (without a global symbol, TVM's MakePackedAPI skips it and every candidate fails
    to build)."""
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def build_kernel(func: tvm.tirx.PrimFunc, target: tvm.target.Target):
    lib = tvm.compile(task_module(func), target=target)
    return lib.jit() if hasattr(lib, "jit") else lib  # an Executable wraps the runtime module


def argument_specs(func: tvm.tirx.PrimFunc) -> list[tuple[list[int], str]]:
    """(shape, dtype) of every parameter: what a device needs to make the arguments."""
    return [([int(d) for d in p.ty.shape], str(p.ty.dtype)) for p in func.params]


def argument_tensors(specs, device, seed: int = 0) -> list:
    """Seeded arguments on ``device`` (here or a farm's): random floats, zero integers (so
    that gathers stay in range). The same seed gives the same values everywhere."""
    rng = np.random.default_rng(seed)
    return [tvm.runtime.tensor(rng.standard_normal(shape).astype(dtype) if dtype.startswith("float")
                               else np.zeros(shape, dtype), device) for shape, dtype in specs]


def kernel_arguments(func: tvm.tirx.PrimFunc, seed: int = 0) -> list:
    return argument_tensors(argument_specs(func), tvm.cpu(), seed)
