"""Scheduling: every PrimFunc gets a schedule before codegen, never a naive loop nest.

Today that is the target's default rule set (no tuning database exists yet; the auto-tuner
issue adds the database lookup in front of it)."""

from __future__ import annotations

import tvm

from aotc.targets import TargetSpec

from . import cpu_rules

RULE_SETS = {"cpu": cpu_rules.RULES}


def default_schedule_pass(spec: TargetSpec) -> tvm.transform.Pass:
    """Apply the target family's rules to every PrimFunc (run under the target)."""
    return ApplyRulesSafely(RULE_SETS[spec.schedule_rules])


@tvm.transform.module_pass(opt_level=0, name="ApplyRulesSafely")
class ApplyRulesSafely:
    """Like dlight's ApplyDefaultSchedule, but a rule that raises on a kernel (TVM's schedule
    primitives reject some shapes, e.g. dlight's Reduction on Inception's pooling+concat) is
    skipped and the next rule tried, instead of failing the whole compile."""

    def __init__(self, rules):
        self.rules = list(rules)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=False)
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc) and not func.attrs.get("tirx.is_scheduled"):
                scheduled = self._first_rule_that_works(func, target)
                if scheduled is not None:
                    updates[gv] = scheduled.with_attr("tirx.is_scheduled", True)
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    def _first_rule_that_works(self, func, target):
        for rule in self.rules:
            try:
                sch = rule.apply(func, target, False)
            except Exception:  # pylint: disable=broad-except  # ScheduleError and friends
                continue
            if sch is not None:
                return (sch[0] if isinstance(sch, list) else sch).mod["main"]
        return None


def unscheduled_functions(mod: tvm.IRModule) -> list[str]:
    """PrimFuncs no rule accepted: reported by the build, so gaps are visible."""
    return [gv.name_hint for gv, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and not f.attrs.get("tirx.is_scheduled")]
