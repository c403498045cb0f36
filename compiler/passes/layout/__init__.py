"""Data layout: conv2d to NHWC/HWIO, with the weight transposes folded at compile time."""

from __future__ import annotations

from aotc.options import CompileOptions

from ..folding import refold
from ..step import Step, enabled
from .convert_layout_nhwc import ConvertLayoutNHWC
from .prepack_weights import PrepackWeights
from .winograd_conv import WinogradConv


def steps() -> list[Step]:
    return [Step(ConvertLayoutNHWC(), 2), *refold()]


# WinogradConv's level (the quantize phase asks whether it will run: winograd_runs)
WINOGRAD_LEVEL = 2


def winograd_runs(options: CompileOptions) -> bool:
    return enabled("WinogradConv", WINOGRAD_LEVEL, options)


def pack_steps(float_lanes: int | None, broadcast_register: bool = False,
               registers: int = 32) -> list[Step]:
    """The pack phase (after quantize): float32 3x3 convs as Winograd kernels, the other
    float32 weights prepacked for the target's SIMD width and register file; ``float_lanes``
    None (GPU rules) packs nothing."""
    return [Step(WinogradConv(float_lanes), WINOGRAD_LEVEL),
            Step(PrepackWeights(float_lanes, broadcast_register, registers), 2)]


__all__ = ["ConvertLayoutNHWC", "PrepackWeights", "WinogradConv", "pack_steps", "steps"]
