"""Algebraic clean-ups: elementwise chains between a reshape and its inverse run on the
unreshaped tensor, splits become slices, layout chains collapsed, zero padding folded into
convolutions, common subexpressions shared and dead code removed (the last two are TVM's own
passes)."""

from __future__ import annotations

from tvm import relax

from ..step import Step
from .collapse_layout_chains import CollapseLayoutChains
from .elementwise_under_reshape import ElementwiseUnderReshape
from .fold_pad_into_conv import FoldPadIntoConv
from .split_into_slices import SplitIntoSlices


def steps() -> list[Step]:
    return [Step(ElementwiseUnderReshape(), 2), Step(SplitIntoSlices(), 2),
            Step(CollapseLayoutChains(), 2),
            Step(FoldPadIntoConv(), 2),
            Step(relax.transform.EliminateCommonSubexpr(), 1),
            Step(relax.transform.DeadCodeElimination(), 1)]


__all__ = ["CollapseLayoutChains", "ElementwiseUnderReshape", "FoldPadIntoConv",
           "SplitIntoSlices", "steps"]
