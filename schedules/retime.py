"""Time several schedules of one kernel together, in alternating rounds.

Why: a tuning run times each candidate once, when it is measured, and kernel timings on a
shared VM drift by tens of percent within an hour. Two tuning runs (or two points of one run's
curve)
are therefore timed under different conditions. Re-timing their schedules side by side,
built once and timed in turn for several rounds (the order rotating each round), puts every
schedule under the same conditions; the median over rounds is what compares them."""

from __future__ import annotations

import dataclasses
import statistics

import tvm

from aotc.measure_settings import TUNE, MeasureSettings

from .measure import kernel_arguments, kernel_timer, task_module


def replay(func: tvm.tirx.PrimFunc, trace_json) -> tvm.tirx.PrimFunc:
    """``func`` scheduled by a trace as the tuner measured it (``Trace.as_json()``, postprocs
    included), named ``main`` like every kernel the tuner builds.

    The module is held here while the schedule works on it: a Schedule of a module that
    nothing else references edits its function in place, and that function shares its body
    with ``func`` (``with_attr`` copies only the top node), so ``func`` itself changed and the
    next replay on it failed."""
    mod = task_module(func)
    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.schedule.Trace.apply_json_to_schedule(trace_json, sch)
    return sch.mod["main"]


def retime(kernels: dict[str, tvm.tirx.PrimFunc], target: tvm.target.Target, rounds: int = 5,
           settings: MeasureSettings = TUNE) -> dict[str, dict]:
    """name -> {"median": seconds, "rounds": [seconds per round]} for scheduled kernels of one
    workload (same arguments). Each is built once; every round times each in turn, starting
    one further along than the round before."""
    if not kernels:
        return {}
    timers = {name: kernel_timer(func, target, settings) for name, func in kernels.items()}
    args = kernel_arguments(next(iter(kernels.values())))
    return in_turns(list(kernels), rounds, lambda name: timers[name](args))


def in_turns(names: list[str], rounds: int, time_one) -> dict[str, dict]:
    """``time_one(name)`` for every name in every round, the order rotating by one each round
    (so that no schedule is always timed first, after a build or a cold start); here and on a
    farm's device."""
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(time_one(name))
    return {name: {"median": statistics.median(t), "rounds": t} for name, t in times.items()}


def one_measurement_per_round(settings: MeasureSettings) -> MeasureSettings:
    """``settings`` with one measurement (of >= min_repeat_ms) per timing: in-turn rounds are
    the repeats, so that a drifting machine moves every schedule's samples alike."""
    return dataclasses.replace(settings, repeat=1)
