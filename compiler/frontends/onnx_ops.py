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

from .onnx_functions import function_schema
from .onnx_gaps import gap_reason
from .onnx_graph import constant_values
from .onnx_qlinear import REWRITES as qlinear_rewrites
from .onnx_rewrites import OWN_CONVERTERS

STANDARD_DOMAINS = ("", "ai.onnx")
QLINEAR = frozenset(qlinear_rewrites)


@dataclass(frozen=True)
class OpRow:
    op_type: str
    domain: str
    count: int
    supported: bool
    reason: str
    first_node: str


# TVM converters not used: the op is expanded from its spec function body instead.
#   Attention: TVM's converter is com.microsoft's contrib op (num_heads attribute, packed QKV
#     weights), not ai.onnx Attention-23.
#   RMSNormalization: TVM's fails to lower axis=0 ("Tensor dimension mismatch in read").
FOREIGN_CONVERTERS = frozenset({"Attention", "RMSNormalization"})


def _converter_map() -> dict:
    """TVM's converters for standard ONNX ops (foreign ones left out)."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map
    return {op: conv for op, conv in _get_convert_map().items() if op not in FOREIGN_CONVERTERS}


def ops_to_expand(model: onnx.ModelProto) -> set[str]:
    """Standard ops of the graph that TVM cannot convert but the spec defines as functions."""
    converters, opset = _converter_map(), model_opset(model)
    return {n.op_type for n in model.graph.node
            if n.domain in STANDARD_DOMAINS and n.op_type not in converters
            and n.op_type not in OWN_CONVERTERS and function_schema(n.op_type, opset)}


def impl_versions(converter) -> list[int]:
    """The opset versions a TVM converter class has an ``_impl_vN`` for."""
    return sorted(int(attr[len("_impl_v"):]) for attr in dir(converter)
                  if attr.startswith("_impl_v") and attr[len("_impl_v"):].isdigit())


def model_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in STANDARD_DOMAINS:
            return entry.version
    return 1


def schema_since(op_type: str, opset: int) -> int | None:
    """The version of the op's schema that applies at ``opset`` (None: onnx knows no such op)."""
    schema = _schema_or_none(op_type, opset)
    return None if schema is None else schema.since_version


def newest_converter_opset() -> int:
    """The newest standard opset any TVM converter has an impl for: the ONNX release the
    converters were written against."""
    return max(v for cls in _converter_map().values() for v in impl_versions(cls))


def opset_problem(op_type: str, opset: int, versions: list[int],
                  used_attrs: frozenset = frozenset()) -> str:
    """'' if the converter can know the op's schema at this opset, else why not.

    Judged by the op's schema, not the model's opset: ``Add`` in an opset-24 model is still
    Add-14. TVM's converters carry impls only where behaviour changed (Add has _impl_v7 and
    serves Add-14), so a schema is refused only when it is newer than every opset the
    converters were written against and the op's own converter has no impl that new."""
    if opset > onnx.defs.onnx_opset_version():
        return (f"opset {opset} is newer than the newest onnx {onnx.__version__} knows "
                f"({onnx.defs.onnx_opset_version()})")
    since = schema_since(op_type, opset)
    if since is None:
        return f"onnx {onnx.__version__} has no schema for {op_type} at opset {opset}"
    newest = newest_converter_opset()
    if since > newest and not any(v >= since for v in versions) and not _only_types_changed(
            op_type, opset, newest, used_attrs):
        return (f"{op_type}-{since} (the schema at opset {opset}) is newer than the converters "
                f"know (opset {newest}; {op_type}'s newest is {op_type}-{max(versions)})")
    return ""


def _only_types_changed(op_type: str, opset: int, known: int, used_attrs: frozenset) -> bool:
    """True when the op's schema at ``opset`` differs from the one at ``known`` only in the
    element types it allows (Reshape-24, Cast-24 added 4-bit and float8 types) or in attributes
    the model does not set (Cast-25's round_mode): same inputs and outputs, and every attribute
    the model's nodes use known to the older schema with the same type. Types a kernel cannot
    hold are refused where the tensor appears."""
    new, old = onnx.defs.get_schema(op_type, opset, ""), _schema_or_none(op_type, known)
    if old is None:
        return False

    def signature(schema):
        return ([(i.name, i.option) for i in schema.inputs],
                [(o.name, o.option) for o in schema.outputs])
    same_attrs = all(name in old.attributes and name in new.attributes
                     and old.attributes[name].type == new.attributes[name].type
                     for name in used_attrs)
    return signature(new) == signature(old) and same_attrs


def _schema_or_none(op_type: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def all_nodes(graph: onnx.GraphProto):
    """The graph's nodes, each followed by the nodes of its subgraphs."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from all_nodes(sub)


def op_table(model: onnx.ModelProto) -> list[OpRow]:
    """One row per (domain, op type) used by the graph and its subgraphs (If branches, Loop
    and Scan bodies), with whether we can import it."""
    converters = _converter_map()
    opset = model_opset(model)
    nodes = list(all_nodes(model.graph))
    counts = collections.Counter((n.domain, n.op_type) for n in nodes)
    first, gaps, attrs = {}, {}, collections.defaultdict(set)
    constants = constant_values(model)
    for node in nodes:
        key = (node.domain, node.op_type)
        first.setdefault(key, node.name or "<unnamed>")
        attrs[key].update(a.name for a in node.attribute)
        reason = gap_reason(node, constants)
        if reason and key not in gaps:
            gaps[key] = f"{reason} (node {node.name or '<unnamed>'!r})"
    rows = []
    for (domain, op_type), count in sorted(counts.items(), key=lambda kv: kv[0][1]):
        if (domain if domain not in STANDARD_DOMAINS else "", op_type) in QLINEAR:
            reason = ""  # expanded to dequantize -> float op -> quantize (onnx_qlinear)
        elif domain not in STANDARD_DOMAINS:
            reason = f"domain {domain!r} is not the standard ONNX domain"
        elif op_type in OWN_CONVERTERS:
            reason = gaps.get((domain, op_type), "")
        elif op_type not in converters and function_schema(op_type, opset) is not None:
            reason = gaps.get((domain, op_type), "")  # expanded from its function body
        elif op_type not in converters:
            reason = "no converter for this op"
        else:
            reason = (opset_problem(op_type, opset, impl_versions(converters[op_type]),
                                    frozenset(attrs[(domain, op_type)]))
                      or gaps.get((domain, op_type), ""))
        rows.append(OpRow(op_type, domain or "ai.onnx", count, not reason, reason,
                          first[(domain, op_type)]))
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
