"""ONNX op-compatibility check, run before any TVM work.

Every unsupported op is listed in one error (type, node name, domain, opset) so that a user
sees the whole problem at once. Ops from a domain other than the standard one are refused even
when an op of the same name exists: plain TVM compiles ``Relu`` from domain ``evil.corp`` as
if it were ``ai.onnx`` Relu, which silently computes the wrong thing.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import onnx

from aotc.errors import UnsupportedModelError

STANDARD_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class OpRow:
    op_type: str
    domain: str
    count: int
    supported: bool
    reason: str
    first_node: str


def _converter_map() -> dict:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map  # pylint: disable=import-outside-toplevel
    return _get_convert_map()


def max_known_opset() -> int:
    """The newest standard opset the TVM converter implements a version for."""
    versions = [int(attr[len("_impl_v"):]) for cls in _converter_map().values()
                for attr in dir(cls) if attr.startswith("_impl_v")]
    return max(versions)


def model_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in STANDARD_DOMAINS:
            return entry.version
    return 1


def op_table(model: onnx.ModelProto) -> list[OpRow]:
    """One row per (domain, op type) used by the main graph, with whether we can import it."""
    converters = _converter_map()
    opset, newest = model_opset(model), max_known_opset()
    counts = collections.Counter((n.domain, n.op_type) for n in model.graph.node)
    first = {}
    for node in model.graph.node:
        first.setdefault((node.domain, node.op_type), node.name or "<unnamed>")
    rows = []
    for (domain, op_type), count in sorted(counts.items(), key=lambda kv: kv[0][1]):
        if domain not in STANDARD_DOMAINS:
            ok, reason = False, f"domain {domain!r} is not the standard ONNX domain"
        elif op_type not in converters:
            ok, reason = False, "no converter for this op"
        elif opset > newest:
            ok, reason = False, f"opset {opset} is newer than the newest known ({newest})"
        else:
            ok, reason = True, ""
        rows.append(OpRow(op_type, domain or "ai.onnx", count, ok, reason, first[(domain, op_type)]))
    return rows


def check_ops(model: onnx.ModelProto, source: str) -> None:
    """Raise one UnsupportedModelError listing every unsupported op of the model."""
    opset = model_opset(model)
    bad = [r for r in op_table(model) if not r.supported]
    if not bad:
        return
    lines = [f"{r.op_type} (domain {r.domain}, opset {opset}, node {r.first_node!r}, "
             f"{r.count} node(s)): {r.reason}" for r in bad]
    raise UnsupportedModelError(
        f"{source}: {len(bad)} unsupported op type(s): " + "; ".join(lines))
