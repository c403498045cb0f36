"""What each pass did: time, Relax op counts and kernel counts before and after
(``aotc compile --explain``). Counting walks the whole module, so it only runs when asked."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import tvm
from tvm import relax


def op_counts(mod: tvm.IRModule) -> Counter:
    """Calls per Relax op (``call_tir`` counted by callee kind, not name) in every Relax
    function; a group a fusion pattern made (a function with a ``Composite`` attribute) counts
    as one call of the pattern, e.g. ``aotc.attention``, and its ops are not counted again."""
    patterns = {gv.name_hint: str(f.attrs["Composite"]) for gv, f in mod.functions_items()
                if isinstance(f, relax.Function) and f.attrs is not None
                and "Composite" in f.attrs}
    counts = Counter()

    def visit(expr):
        if not isinstance(expr, relax.Call):
            return
        if isinstance(expr.op, tvm.ir.Op):
            counts[expr.op.name.removeprefix("relax.")] += 1
        elif isinstance(expr.op, tvm.ir.GlobalVar) and expr.op.name_hint in patterns:
            counts[patterns[expr.op.name_hint]] += 1
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and gv.name_hint not in patterns:
            relax.analysis.post_order_visit(func, visit)
    return counts


def kernel_count(mod: tvm.IRModule) -> int:
    return sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in mod.functions_items())


@dataclass
class PassRecord:
    phase: str
    name: str
    seconds: float
    ops_before: Counter
    ops_after: Counter
    kernels_before: int
    kernels_after: int

    def changes(self, limit: int = 4) -> str:
        """The largest op-count changes, e.g. ``add -35, multiply -18``."""
        delta = Counter(self.ops_after)
        delta.subtract(self.ops_before)
        moved = sorted(((op, n) for op, n in delta.items() if n), key=lambda kv: -abs(kv[1]))
        text = ", ".join(f"{op} {n:+d}" for op, n in moved[:limit])
        return text + (f", ... ({len(moved) - limit} more)" if len(moved) > limit else "")


@dataclass
class Explanation:
    records: list[PassRecord] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # phase, pass, why
    later_phases: dict[str, float] = field(default_factory=dict)  # codegen, export: seconds
    memory: dict = field(default_factory=dict)  # compiler/memory_report.py

    def table(self) -> str:
        lines = [f"{'phase':9s} {'pass':26s} {'seconds':>7s} {'ops':>11s} {'kernels':>9s}  changed"]
        for r in self.records:
            ops = f"{sum(r.ops_before.values())}->{sum(r.ops_after.values())}"
            kernels = f"{r.kernels_before}->{r.kernels_after}"
            lines.append(f"{r.phase:9s} {r.name:26s} {r.seconds:7.2f} {ops:>11s} {kernels:>9s}  "
                         f"{r.changes() or '-'}")
        for phase, name, why in self.skipped:
            lines.append(f"{phase:9s} {name:26s} skipped ({why})")
        per_phase: dict[str, float] = {}
        for r in self.records:
            per_phase[r.phase] = per_phase.get(r.phase, 0.0) + r.seconds
        per_phase.update(self.later_phases)
        lines.append("time per phase: " + ", ".join(f"{p} {s:.2f} s" for p, s in per_phase.items()))
        planned, unplanned = self.memory.get("planned_bytes"), self.memory.get("unplanned_bytes")
        if planned and unplanned:
            lines.append(f"activation memory: planned {planned / 1e6:.2f} MB, unplanned sum "
                         f"{unplanned / 1e6:.2f} MB ({planned / unplanned:.2f}x)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"passes": [{"phase": r.phase, "pass": r.name, "seconds": round(r.seconds, 4),
                            "ops_before": sum(r.ops_before.values()),
                            "ops_after": sum(r.ops_after.values()),
                            "kernels_before": r.kernels_before, "kernels_after": r.kernels_after,
                            "changed": r.changes(limit=100)} for r in self.records],
                "skipped": [{"phase": p, "pass": n, "why": w} for p, n, w in self.skipped],
                "later_phases_seconds": self.later_phases, "memory": self.memory}
