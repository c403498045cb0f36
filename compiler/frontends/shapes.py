"""Parsing and applying ``--input-shape name=1,3,224,224`` overrides."""

from __future__ import annotations

from aotc.errors import AotcError


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """'input=1,3,224,224' -> ('input', (1, 3, 224, 224))."""
    name, sep, dims = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
        if not shape or any(d <= 0 for d in shape):
            raise ValueError
    except ValueError:
        raise AotcError(f"bad --input-shape {text!r}: expected NAME=D1,D2,... with positive "
                        "integers, e.g. input=1,3,224,224") from None
    return name, shape


def apply_overrides(shapes: dict[str, tuple], overrides: dict[str, tuple[int, ...]],
                    source: str) -> dict[str, tuple]:
    """Replace model input shapes by user overrides; unknown names and rank changes fail."""
    unknown = sorted(set(overrides) - set(shapes))
    if unknown:
        raise AotcError(f"{source}: --input-shape names unknown input(s) {unknown}; "
                        f"the model's inputs are {sorted(shapes)}")
    result = dict(shapes)
    for name, shape in overrides.items():
        if len(shape) != len(shapes[name]):
            raise AotcError(f"{source}: input {name!r} has rank {len(shapes[name])} "
                            f"(shape {list(shapes[name])}), --input-shape gave {list(shape)}")
        for want, got in zip(shapes[name], shape):
            if isinstance(want, int) and want > 0 and want != got:
                raise AotcError(f"{source}: input {name!r} has fixed shape {list(shapes[name])}, "
                                f"--input-shape gave {list(shape)}")
        result[name] = tuple(shape)
    return result
