"""Search strategies the tuner can run, by the name the CLI passes (``--search``).

``rl``: our policy-gradient search over trace decisions (rl.py); ``evolutionary``:
MetaSchedule's evolutionary search, the baseline. Both search the same space with the same
cost model, builder and runner, so their results compare."""

from __future__ import annotations

from .rl import RLSearch, SearchStats

KINDS = ("rl", "evolutionary")


def create(kind: str, stats: SearchStats | None = None):
    """A strategy for TuneContext: an object (rl) or MetaSchedule's name for its own."""
    if kind == "rl":
        return RLSearch(stats)
    if kind == "evolutionary":
        return "evolutionary"
    raise ValueError(f"unknown search {kind!r}: expected one of {', '.join(KINDS)}")


__all__ = ["KINDS", "RLSearch", "SearchStats", "create"]
