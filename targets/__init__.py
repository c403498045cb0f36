"""Target registry: a dict of families, each giving TargetSpecs by name. ``arm`` and ``cuda``
families plug in here (a later issue); nothing else in aotc names a target."""

from __future__ import annotations

from aotc.errors import TargetError

from . import x86
from .spec import TargetSpec

# family -> function returning the family's targets (host-dependent ones computed lazily)
FAMILIES = {
    "x86": lambda: [x86.host(), *x86.fixed()],
}


def all_targets() -> list[TargetSpec]:
    return [spec for family in FAMILIES.values() for spec in family()]


def resolve(name: str) -> TargetSpec:
    for spec in all_targets():
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in all_targets())
    raise TargetError(f"unknown target {name!r}; known targets: {known}")


__all__ = ["TargetSpec", "all_targets", "resolve"]
