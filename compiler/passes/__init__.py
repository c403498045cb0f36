"""aotc's own Relax passes, one per file (see each module's docstring for where it sits)."""

from .lift_minmax_call_tir import LiftMinMaxCallTIR

__all__ = ["LiftMinMaxCallTIR"]
