"""Compile-time arithmetic: constants folded (numpy first, then TVM's FoldConstant where
something is left for it), inference-
only ops decomposed, per-channel scale/shift folded into conv/matmul weights."""

from __future__ import annotations

from tvm import relax

from ..step import REQUIRED, Step
from .fold_channel_affine import FoldChannelAffine
from .fold_constants_numpy import FoldConstantsNumpy
from .fold_remaining_constants import FoldRemainingConstants
from .legalize_dynamic_slices import LegalizeDynamicSlices


def steps() -> list[Step]:
    return [Step(LegalizeDynamicSlices(), REQUIRED, "FoldConstant fails on dynamic slices"),
            Step(relax.transform.DecomposeOpsForInference(), REQUIRED,
                 "BatchNorm has no inference-mode legalization otherwise"),
            *refold(),
            Step(FoldChannelAffine(), 3)]


def refold() -> list[Step]:
    """Constant folding alone: after a pass that leaves constant expressions behind (the
    layout pass's weight transposes)."""
    return [Step(FoldConstantsNumpy(), 1), Step(FoldRemainingConstants(), 1)]


__all__ = ["FoldChannelAffine", "FoldConstantsNumpy", "FoldRemainingConstants",
           "LegalizeDynamicSlices", "refold", "steps"]
