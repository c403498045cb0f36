"""Ops TVM has no converter for, expanded into their ONNX function bodies.

Why: many newer or composite ONNX ops are defined by the spec as a function of simpler ops
(NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, CenterCropPad, Celu, Swish, SwiGLU,
RotaryEmbedding, the window functions...). TVM 0.27 converts none of them; their bodies use
ops it does convert. The body is the spec's own definition, so expanding it is exact.

How: the schema's (context-dependent) FunctionProto for the model's opset, given the node's
input types, becomes a model-local function that the node calls; onnx's inliner then
substitutes attributes and renames its internals. Runs before constant folding, so shape
arithmetic inside the bodies folds too.
"""

from __future__ import annotations

import onnx
import onnx.inliner
from onnx import helper

from aotc.errors import UnsupportedModelError, meaningful_line

from .onnx_graph import GraphInfo

DOMAIN = "aotc.expanded"


def function_schema(op_type: str, opset: int):
    """The op's schema if the spec defines it as a function at ``opset``, else None."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None
    if schema.has_function or schema.has_context_dependent_function:
        return schema
    return None


def expand_functions(model: onnx.ModelProto, info: GraphInfo, ops: set[str]) -> onnx.ModelProto:
    """A copy of ``model`` with every node whose op_type is in ``ops`` inlined from its
    function body. A node whose body cannot be built (input types unknown) is left as it is,
    and TVM's importer then names it."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    functions = []
    for k, node in enumerate(out.graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type not in ops:
            continue
        body, body_version = _body(node, info)
        if body is None:
            continue
        body.domain, body.name = DOMAIN, f"{node.op_type}_{k}"
        if not any(o.domain == "" for o in body.opset_import):
            body.opset_import.append(helper.make_opsetid("", body_version))
        node.domain, node.op_type = DOMAIN, body.name
        functions.append(body)
    if not functions:
        return model
    out.functions.extend(functions)
    out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    # convert_version: a body written for an older opset (ReduceMean with an axes attribute)
    # is converted to the model's, where the op may take its axes as an input. Only when
    # needed: the converter wants every intermediate type and fails on some bodies.
    convert = any(o.domain == "" and o.version != info.opset
                  for body in functions for o in body.opset_import)
    try:
        inlined = onnx.inliner.inline_local_functions(out, convert_version=convert)
    except RuntimeError as err:  # onnx's version converter needs every intermediate type
        raise UnsupportedModelError(
            f"could not expand {sorted(ops)} from their ONNX function bodies: "
            f"{meaningful_line(err)}") from None
    del inlined.opset_import[:]
    inlined.opset_import.extend(op for op in out.opset_import if op.domain != DOMAIN)
    return inlined


def _body(node: onnx.NodeProto, info: GraphInfo) -> tuple[onnx.FunctionProto | None, int]:
    """(body, its opset version): the newest body version not newer than the model's opset
    (the schema API returns an empty function for any other version)."""
    schema = function_schema(node.op_type, info.opset)
    if schema is None:
        return None, 0
    if schema.has_function:
        version = _applicable(schema.function_opset_versions, info.opset)
        if version is None:
            return None, 0
        return _parse(schema.get_function_with_opset_version(version)), version
    version = _applicable(schema.context_dependent_function_opset_versions, info.opset)
    types = [_type_proto(info, name) for name in node.input]
    if version is None or any(t is None for t in types):
        return None, 0
    body = _parse(schema.get_context_dependent_function_with_opset_version(
        version, node.SerializeToString(), [t.SerializeToString() for t in types]))
    return (body, version) if body.node else (None, 0)


def _applicable(versions, opset: int) -> int | None:
    usable = [v for v in versions if v <= opset]
    return max(usable) if usable else None


def _parse(function) -> onnx.FunctionProto:
    """A fresh FunctionProto: the schema API hands out serialized bytes or shared protos."""
    copy = onnx.FunctionProto()
    if isinstance(function, bytes):
        copy.ParseFromString(function)
    else:
        copy.CopyFrom(function)
    return copy


def _type_proto(info: GraphInfo, name: str) -> onnx.TypeProto | None:
    if not name:
        return onnx.TypeProto()  # an omitted optional input
    elem, shape = info.elem_type(name), info.shape(name)
    if elem is None:
        return None
    return helper.make_tensor_type_proto(elem, shape)
