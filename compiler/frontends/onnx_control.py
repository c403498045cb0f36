"""ONNX ``If`` as straight-line ops: TVM 0.27 has no converter for If (nor Loop, Scan).

A constant condition (often one after shape folding, or an input fixed with ``--bind``) inlines
the branch it selects. A run-time condition with outputs of one static shape (ONNX shape
inference merges the branches'; an unknown dim means they may differ) inlines both branches and
selects each output with ``Where``: both are computed, which is correct for ONNX's side-effect-
free branches, costs the branch not taken and keeps the graph one dataflow block that fuses.
Outputs whose shapes differ between branches leave the If to TVM's importer, which makes it a
Relax ``If`` (one branch runs; the graph around it is not fused); onnx_importer gives its
results fresh symbolic dims.

Branch-internal names are renamed (they may repeat outer names); branch initializers become
Constant nodes. A branch that itself holds a subgraph (a nested If, Loop or Scan) is refused."""

from __future__ import annotations

import onnx
from onnx import helper

from aotc.errors import UnsupportedModelError

from .onnx_graph import GraphInfo, node_attrs


def if_to_where(node: onnx.NodeProto, info: GraphInfo) -> list[onnx.NodeProto]:
    attrs = node_attrs(node)
    then_graph, else_graph = attrs["then_branch"], attrs["else_branch"]
    cond = node.input[0]
    if cond in info.constants:
        chosen = then_graph if bool(info.constants[cond].reshape(-1)[0]) else else_graph
        nodes, outs = inline_branch(chosen, info, node)
        return nodes + [helper.make_node("Identity", [o], [name])
                        for o, name in zip(outs, node.output)]
    for name in node.output:
        shape = info.shape(name)
        if shape is None or None in shape:
            return None  # TVM's importer makes it a Relax If: one branch runs
    then_nodes, then_outs = inline_branch(then_graph, info, node)
    else_nodes, else_outs = inline_branch(else_graph, info, node)
    selects = [helper.make_node("Where", [cond, t, e], [name])
               for t, e, name in zip(then_outs, else_outs, node.output)]
    return then_nodes + else_nodes + selects


def inline_branch(graph: onnx.GraphProto, info: GraphInfo, node: onnx.NodeProto,
                  bindings: dict[str, str] | None = None):
    """The subgraph's nodes with its own names made fresh; returns (nodes, its output names).
    ``bindings`` maps the subgraph's inputs (a Scan body's state and elements) to outer names."""
    renamed: dict[str, str] = dict(bindings or {})
    nodes = []
    for init in graph.initializer:
        renamed[init.name] = info.fresh("branch_const")
        nodes.append(helper.make_node("Constant", [], [renamed[init.name]], value=init))
    for inner in graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in inner.attribute):
            raise UnsupportedModelError(
                f"{node.op_type} node {node.name!r}: a subgraph holds nested control flow "
                f"({inner.op_type}), "
                "which aotc does not inline yet")
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.input[:] = [renamed.get(n, n) for n in inner.input]
        for k, out in enumerate(inner.output):
            if out:
                renamed[out] = info.fresh("branch")
                copy.output[k] = renamed[out]
        nodes.append(copy)
    return nodes, [renamed.get(o.name, o.name) for o in graph.output]
