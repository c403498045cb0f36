"""Fold the ONNX graph's constant shape arithmetic before TVM sees it.

Why: exporters compute shapes at run time (``Shape -> Gather -> Concat -> Reshape`` in
PaddlePaddle and older torch exports, the expanded function bodies of the node suite). TVM 0.27's
importer turns ``Shape`` into a ShapeExpr that most converters reject ("Node cannot handle
ShapeExpr inputs", "Reshape requires the input new shape to be Shape", "Only constant axes
currently supported"): 300+ node-suite cases and real models failed there even with every input
shape fixed. Once input shapes are fixed those values are constants; here they become constants.

How: walk the nodes in order; a ``Shape``/``Size`` of a tensor whose inferred shape is static
becomes a constant; any other standard op whose inputs are all constants and small (shape-sized,
not weights: TVM folds those itself) is evaluated with onnx's reference implementation, the
spec's own semantics. Random ops and ops with subgraphs are never folded.
"""

from __future__ import annotations

import warnings
from collections import ChainMap

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .onnx_graph import GraphInfo, node_attrs

# Shape-sized values only: folding big weight tensors is TVM's FoldConstant's job and would
# bloat the model here.
MAX_ELEMENTS = 1 << 14
NEVER_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Bernoulli", "Multinomial", "If", "Loop", "Scan", "Constant"}


def fold_constants(model: onnx.ModelProto, info: GraphInfo, in_place: bool = False
                   ) -> tuple[onnx.ModelProto, int]:
    """``model`` with foldable nodes replaced by Constant nodes; returns (model, n). A copy,
    unless ``in_place`` (copying a model copies all its weights, in every round); ``model``
    itself when nothing folds."""
    # folded values over the graph's own constants (read from GraphInfo as they are needed)
    known = ChainMap({}, info.constants)
    nodes, folded = [], 0
    for node in model.graph.node:
        values = _fold(node, known, info)
        if values is None:
            nodes.append(node)
            continue
        folded += 1
        for name, value in zip(node.output, values):
            if name:
                known[name] = value
                nodes.append(helper.make_node("Constant", [], [name],
                                              value=numpy_helper.from_array(value, name)))
    if not folded:
        return model, 0
    out = model
    if not in_place:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, folded


def _fold(node: onnx.NodeProto, known: dict, info: GraphInfo) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type in NEVER_FOLD:
        return None
    if node.op_type in ("Shape", "Size"):
        return _static_shape(node, info)
    inputs = [n for n in node.input if n]
    if not inputs or not all(n in known for n in inputs):
        return None
    if sum(_size(known, n) for n in inputs) > MAX_ELEMENTS:
        return None
    return _evaluate(node, known, info.opset)


def _size(known: ChainMap, name: str) -> int:
    folded, constants = known.maps
    return int(np.asarray(folded[name]).size) if name in folded else constants.size(name)


def _static_shape(node: onnx.NodeProto, info: GraphInfo) -> list[np.ndarray] | None:
    shape = info.shape(node.input[0])
    if shape is None or None in shape:
        return None
    if node.op_type == "Size":
        return [np.array(int(np.prod(shape)), dtype=np.int64)]
    attrs = node_attrs(node)
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return [np.array(shape[start:end], dtype=np.int64)]


def _evaluate(node: onnx.NodeProto, known: dict, opset: int) -> list[np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator
    feeds = {n: known[n] for n in node.input if n}
    graph = helper.make_graph(
        [node], "fold",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
         for n in node.output if n])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            outputs = ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # not foldable here: TVM converts it
        return None
    values = [np.asarray(v) for v in outputs]
    if any(v.dtype == object or v.size > MAX_ELEMENTS for v in values):
        return None
    return values
