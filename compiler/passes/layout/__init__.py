"""Data layout: conv2d to NHWC/HWIO, with the weight transposes folded at compile time."""

from __future__ import annotations

from ..folding import refold
from ..step import Step
from .convert_layout_nhwc import ConvertLayoutNHWC


def steps() -> list[Step]:
    return [Step(ConvertLayoutNHWC(), 2), *refold()]


__all__ = ["ConvertLayoutNHWC", "steps"]
