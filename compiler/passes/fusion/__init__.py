"""Fusion patterns beyond TVM's FuseOps: projections that share an input combined into one
matmul (Q/K/V, gate/up), attention as one kernel."""

from __future__ import annotations

from ..step import Step
from .attention import FuseAttention
from .combine_projections import CombineProjections


def steps() -> list[Step]:
    return [Step(CombineProjections(), 2), Step(FuseAttention(), 2)]


__all__ = ["CombineProjections", "FuseAttention", "steps"]
