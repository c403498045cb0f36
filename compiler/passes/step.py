"""Step: one pass of the pipeline with the opt level it needs (or REQUIRED: correctness or
loading depends on it, so no option removes it). Every pass group returns a list of these."""

from __future__ import annotations

from dataclasses import dataclass

import tvm

from aotc.options import CompileOptions

REQUIRED = None  # the level of a pass that always runs


@dataclass(frozen=True)
class Step:
    pass_: tvm.transform.Pass
    level: int | None
    why_required: str = ""

    @property
    def name(self) -> str:
        return self.pass_.info.name


def enabled(name: str, level: int | None, options: CompileOptions) -> bool:
    """Whether a pass of this name and level runs under ``options``."""
    return level is REQUIRED or (level <= options.opt_level and
                                 name not in options.disabled_passes)
