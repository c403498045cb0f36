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


def parse_input_range(text: str) -> tuple[str, tuple[int, int]]:
    """'seq=1:512' -> ('seq', (1, 512)): the sizes a symbolic dim may take."""
    name, sep, bounds = text.partition("=")
    low, colon, high = bounds.partition(":")
    try:
        if not sep or not name or not colon:
            raise ValueError
        low_value, high_value = int(low), int(high)
        if not 1 <= low_value <= high_value:
            raise ValueError
    except ValueError:
        raise AotcError(f"bad --input-range {text!r}: expected DIM=MIN:MAX with "
                        "1 <= MIN <= MAX, e.g. seq=1:512 (DIM: a symbolic dim's name)") from None
    return name, (low_value, high_value)


def parse_bind(text: str) -> tuple[str, list[float]]:
    """'sr=16000' -> ('sr', [16000.0]); 'scales=1,2,2' -> ('scales', [1.0, 2.0, 2.0]). The
    input's dtype decides the values' type."""
    name, sep, values = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        numbers = [float(v) for v in values.split(",")]
    except ValueError:
        raise AotcError(f"bad --bind {text!r}: expected NAME=V or NAME=V1,V2,... with "
                        "numbers, e.g. sr=16000") from None
    return name, numbers


def parse_buckets(text: str) -> tuple[str, tuple[int, ...]]:
    """'seq=16,32,64' -> ('seq', (16, 32, 64)): sizes of a symbolic dim to specialize for."""
    name, sep, sizes = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        values = tuple(sorted({int(v) for v in sizes.split(",")}))
        if not values or values[0] < 1:
            raise ValueError
    except ValueError:
        raise AotcError(f"bad --buckets {text!r}: expected DIM=S1,S2,... with positive "
                        "sizes, e.g. seq=16,32,64,128 (DIM: a symbolic dim's name)") from None
    return name, values


def check_dim_names(flag: str, names, inputs, source: str) -> None:
    """``flag`` (--input-range, --buckets) names only symbolic dims of the model's inputs."""
    dims = {d for t in inputs for d in t.shape if isinstance(d, str)}
    unknown = sorted(set(names) - dims)
    if unknown:
        raise AotcError(f"{source}: {flag} names {unknown}, which no input has; the model's "
                        f"symbolic dims are {sorted(dims) or 'none'}")
