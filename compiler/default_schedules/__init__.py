"""Scheduling: every PrimFunc gets a schedule before codegen, never a naive loop nest.

A kernel whose workload has a record in the tuning logs (``tuned``: the shipped logs and
``--tuning-log``) that beat the default rules, timed against today's defaults, gets that
record's schedule; every other kernel gets the first of the target's default rules that
accepts it (cpu_rules.RULES, gpu_rules.RULES). A record that no longer replays falls back to
the default rules with a warning naming the kernel."""

from __future__ import annotations

import functools
import logging

import tvm

from aotc.errors import CompileError, meaningful_line
from aotc.targets import TargetSpec

from ..kernel_table import with_flops
from . import cpu_rules, gpu_rules
from .vector_allocations import allocated_in_vectorized_loops

RULE_SETS = {"cpu": cpu_rules.RULES, "gpu": gpu_rules.RULES}
LOG = logging.getLogger("aotc.schedule")
# Python errors a rule raises only through a mistake in its own code; TVM's schedule
# primitives reject unsupported shapes with TVM errors (RuntimeError subclasses) instead.
BUG_ERRORS = (AttributeError, NameError, TypeError, KeyError, ImportError)


def default_schedule_pass(spec: TargetSpec, tuned=None) -> tvm.transform.Pass:
    """Schedule every PrimFunc (run under the target): ``tuned.schedule_for(func, target,
    default)`` first when a source of tuned schedules is given (it returns None for kernels it
    has no usable record of; ``default()`` gives the default rules' schedule it may compare
    with), the target family's default rules for the rest."""
    return ApplyRulesSafely(RULE_SETS[spec.schedule_rules], tuned)


@tvm.transform.module_pass(opt_level=0, name="ApplyRulesSafely")
class ApplyRulesSafely:
    """Like dlight's ApplyDefaultSchedule, but a rule that TVM's schedule primitives reject on
    a kernel (some shapes, e.g. dlight's Reduction on Inception's pooling+concat) is skipped
    and the next rule tried, instead of failing the whole compile. A Python error in a rule
    (BUG_ERRORS) fails the compile with the rule and kernel named."""

    def __init__(self, rules, tuned=None):
        self.rules = list(rules)
        self.tuned = tuned

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=False)
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc) and not func.attrs.get("tirx.is_scheduled"):
                func = with_flops(func)
                default = functools.cache(lambda f=func: self._first_rule_that_works(f, target))
                scheduled = self._tuned(func, target, default)
                if scheduled is not None:
                    scheduled = scheduled.with_attr("tirx.is_scheduled", True).with_attr(
                        "aotc.tuned", True)
                else:
                    scheduled = default()
                    scheduled = func if scheduled is None else scheduled.with_attr(
                        "tirx.is_scheduled", True)
                # after the lookup: the workload key hashes the function, attributes included
                updates[gv] = self._with_estimate(func, scheduled)
        mod = mod.clone()  # the caller's module must not change (passes get it itself)
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    def _with_estimate(self, func, scheduled):
        """``scheduled`` with the run time the tuning logs measured for ``func``
        (ESTIMATE_ATTR), if they did."""
        estimate = getattr(self.tuned, "estimated_seconds", None)
        seconds = estimate(func) if estimate is not None else None
        return scheduled if seconds is None else scheduled.with_attr(ESTIMATE_ATTR, float(seconds))

    def _tuned(self, func, target, default):
        if self.tuned is None:
            return None
        name = func.attrs.get("global_symbol", "kernel") if func.attrs else "kernel"
        try:
            scheduled = self.tuned.schedule_for(func, target, default)
        except Exception as err:  # a record that does not replay
            LOG.warning("tuned schedule for kernel %s did not apply (%s): default rules",
                        name, meaningful_line(err))
            return None
        unsafe = [] if scheduled is None else allocated_in_vectorized_loops(scheduled)
        if unsafe:
            LOG.warning("tuned schedule for kernel %s allocates %s inside a vectorized loop "
                        "(TVM would give all its lanes one copy): default rules", name,
                        ", ".join(unsafe))
            return None
        return scheduled

    def _first_rule_that_works(self, func, target):
        sch = first_schedule_that_works(self.rules, func, target)
        return None if sch is None else sch.mod["main"]


def first_schedule_that_works(rules, func, target):
    """The schedule of the first of ``rules`` that accepts ``func`` (a traced Schedule; None
    when none does). A rule that TVM's primitives reject on the kernel is skipped, as is a
    schedule that allocates inside a vectorized loop (vector_allocations.py); a Python error in
    a rule (BUG_ERRORS) is a CompileError naming the rule and kernel."""
    name = func.attrs.get("global_symbol", "kernel") if func.attrs else "kernel"
    for rule in rules:
        try:
            sch = rule.apply(func, target, False)
        except BUG_ERRORS as err:
            # A bug in a rule of ours, not a shape TVM's primitives reject: swallowed, it
            # would leave kernels unscheduled, two orders of magnitude slower, with no error.
            raise CompileError(f"schedule rule {type(rule).__name__} failed on kernel "
                               f"{name}: {type(err).__name__}: {err}") from err
        except Exception as err:  # ScheduleError and friends
            LOG.debug("schedule rule %s rejected kernel %s: %s", type(rule).__name__, name,
                      meaningful_line(err))
            continue
        if sch is None:
            continue
        sch = sch[0] if isinstance(sch, list) else sch
        unsafe = allocated_in_vectorized_loops(sch.mod["main"])
        if unsafe:
            # TVM would compile it to wrong results (vector_allocations.py): a rule's mistake,
            # said so, and the next rule takes the kernel.
            LOG.warning("schedule rule %s allocates %s inside a vectorized loop of kernel %s; "
                        "the next rule takes it", type(rule).__name__, ", ".join(unsafe), name)
            continue
        return sch
    return None


ESTIMATE_ATTR = "aotc.estimated_seconds"


def tuning_share(mod: tvm.IRModule, kernels: list[dict]) -> dict:
    """Share of the estimated run time spent in tuned kernels: each kernel's time as the tuning
    logs measured it (ESTIMATE_ATTR) times its calls (``kernels``: kernel_table). Kernels the
    logs never saw have no estimate and are counted apart."""
    calls = {k["name"]: k["calls"] for k in kernels}
    tuned, total, estimated, counted = 0.0, 0.0, 0, 0
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs is None:
            continue
        symbol = str(func.attrs.get("global_symbol") or gv.name_hint)
        if symbol not in calls:
            continue
        counted += 1
        if ESTIMATE_ATTR not in func.attrs:
            continue
        seconds = float(func.attrs[ESTIMATE_ATTR]) * calls[symbol]
        estimated += 1
        total += seconds
        tuned += seconds if func.attrs.get("aotc.tuned") else 0.0
    return {"kernels": counted, "kernels_estimated": estimated,
            "estimated_seconds": total, "tuned_share": tuned / total if total else None}


def tuned_functions(mod: tvm.IRModule) -> list[str]:
    """PrimFuncs whose schedule came from a tuning log."""
    return [gv.name_hint for gv, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("aotc.tuned")]


def unscheduled_functions(mod: tvm.IRModule) -> list[str]:
    """PrimFuncs no rule accepted: reported by the build, so gaps are visible."""
    return [gv.name_hint for gv, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and not f.attrs.get("tirx.is_scheduled")]
