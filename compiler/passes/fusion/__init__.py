"""Fusion patterns beyond TVM's FuseOps: attention as one kernel."""

from __future__ import annotations

from ..step import Step
from .attention import FuseAttention


def steps() -> list[Step]:
    return [Step(FuseAttention(), 2)]


__all__ = ["FuseAttention", "steps"]
