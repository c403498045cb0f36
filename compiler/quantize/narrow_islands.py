"""Which int8 sites stay float32 because int8 would make them slower: a conv that reads at
most 4 channels (VNNI sums 4 bytes per lane, so it gets no more than one tap per multiply)
and whose output reaches no other int8 layer. Such a conv (an image model's stem, feeding a
float32 depthwise conv or a layer norm) pays for int8 twice, quantizing its input (a pass of
its own when the input is the model's) and widening its output back, and saves little.

Measurements (MobileNetV2's stem faster in float32; ResNet-18's, which feeds int8 convs,
slower): docs/design/measurements.md#compilerquantizenarrow_islandspy."""

from __future__ import annotations

from tvm import relax

from ..contraction_sites import Site
from ..frontends.relax_shapes import static_shape
from ..relax_walk import op_name

NARROW_CHANNELS = 4
# ops an int8 chain passes through (the next layer reads their output quantized)
INT8_TRANSPARENT = {"relax.nn.relu", "relax.clip", "relax.maximum", "relax.minimum",
                    "relax.add", "relax.multiply", "relax.nn.max_pool2d", "relax.reshape",
                    "relax.permute_dims"}


def narrow_islands(func: relax.Function, sites: list[Site]) -> dict[str, str]:
    """{site name: why it stays float32} for the narrow convs no int8 layer follows."""
    users = _users(func)
    site_vars = {site.var for site in sites}
    out = {}
    for site in sites:
        if op_name(site.call) != "relax.nn.conv2d":
            continue
        channels = (static_shape(site.activation) or [None])[-1]
        if channels is None or channels > NARROW_CHANNELS:
            continue
        if not _reaches(site.var, site_vars, users):
            out[site.name] = (f"float32: {channels} input channels and no int8 layer after "
                              "it (quantizing for it costs more than int8 saves)")
    return out


def _users(func: relax.Function) -> dict:
    """var -> the (var, value) of each binding that reads it."""
    values = relax.analysis.get_var2val(func)
    users: dict = {}
    for block in getattr(func.body, "blocks", []):
        for var, readers in relax.analysis.udchain(block).items():
            users.setdefault(var, []).extend((r, values.get(r)) for r in readers)
    return users


def _reaches(start: relax.Var, site_vars: set, users: dict) -> bool:
    """Whether a site reads ``start``'s value, directly or through int8-transparent ops."""
    todo, seen = [start], set()
    while todo:
        var = todo.pop()
        for user_var, call in users.get(var, []):
            if user_var in site_vars:
                return True
            if op_name(call) in INT8_TRANSPARENT and user_var not in seen:
                seen.add(user_var)
                todo.append(user_var)
    return False
