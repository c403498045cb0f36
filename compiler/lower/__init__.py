"""Scheduling: every PrimFunc gets a schedule before codegen, never a naive loop nest.

Today that is the target's default rule set (no tuning database exists yet; the auto-tuner
issue adds the database lookup in front of it)."""

from __future__ import annotations

import tvm
from tvm.s_tir import dlight as dl

from aotc.targets import TargetSpec

from . import cpu_rules

RULE_SETS = {"cpu": cpu_rules.RULES}


def default_schedule_pass(spec: TargetSpec) -> tvm.transform.Pass:
    """dlight's ApplyDefaultSchedule with the target family's rules (run under the target)."""
    return dl.ApplyDefaultSchedule(*RULE_SETS[spec.schedule_rules])


def unscheduled_functions(mod: tvm.IRModule) -> list[str]:
    """PrimFuncs no rule accepted: reported by the build, so gaps are visible."""
    return [gv.name_hint for gv, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and not f.attrs.get("tirx.is_scheduled")]
