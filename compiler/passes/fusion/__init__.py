"""Fusion patterns beyond TVM's FuseOps."""

from __future__ import annotations

from ..step import Step


def steps() -> list[Step]:
    return []


__all__ = ["steps"]
