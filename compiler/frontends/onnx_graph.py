"""What the ONNX-level rewrites need to know about a graph: constant values, inferred shapes and
element types, fresh names, and the opset. Built once per import, after input shapes are fixed."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper


class GraphInfo:
    """Read-only facts about a model's main graph, plus a fresh-name source for new nodes."""

    def __init__(self, model: onnx.ModelProto, opset: int):
        self.opset = opset
        self.constants = constant_values(model)
        self._types = _inferred_types(model)
        self._counter = itertools.count()
        self._used = {n for node in model.graph.node for n in [*node.input, *node.output]}

    def shape(self, name: str) -> list[int | None] | None:
        """Static dims (None where unknown), or None if even the rank is unknown."""
        if name in self.constants:
            return list(self.constants[name].shape)
        ttype = self._types.get(name)
        if ttype is None or not ttype.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]

    def elem_type(self, name: str) -> int | None:
        if name in self.constants:
            return onnx.helper.np_dtype_to_tensor_dtype(self.constants[name].dtype)
        ttype = self._types.get(name)
        return ttype.elem_type if ttype is not None and ttype.elem_type else None

    def fresh(self, hint: str) -> str:
        while True:
            name = f"aotc_{hint}_{next(self._counter)}"
            if name not in self._used:
                self._used.add(name)
                return name


def name_hint(name: str, length: int, fallback: str) -> str:
    """The last ``length`` characters of an ONNX name as an identifier (for the names of
    symbolic dims and functions made from it)."""
    return "".join(c if c.isalnum() else "_" for c in name)[-length:] or fallback


def node_attrs(node: onnx.NodeProto) -> dict:
    """The node's attributes as Python values, by name."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def constant_values(model: onnx.ModelProto) -> Constants:
    """Initializers and Constant-node outputs of the main graph, as numpy (read on first
    access: an import builds this several times, and most of a model's weights are never
    looked at by a rewrite)."""
    return Constants(model.graph)


class Constants(Mapping):
    """name -> numpy value of the graph's initializers and Constant nodes, each converted from
    its TensorProto once, when first read."""

    def __init__(self, graph: onnx.GraphProto):
        self._sources: dict = {t.name: t for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.attribute:
                if node.attribute[0].name in _CONSTANT_ATTRS:
                    self._sources[node.output[0]] = node
        self._values: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._values:
            source = self._sources[name]
            self._values[name] = (numpy_helper.to_array(source)
                                  if isinstance(source, onnx.TensorProto)
                                  else _constant_node_value(source))
        return self._values[name]

    def __iter__(self):
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)

    def size(self, name: str) -> int:
        """Element count of a constant, without converting an initializer."""
        source = self._sources[name]
        if isinstance(source, onnx.TensorProto):
            return int(np.prod(source.dims))
        return int(np.asarray(self[name]).size)


_CONSTANT_ATTRS = ("value", "value_float", "value_int", "value_floats", "value_ints")


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    attr = node.attribute[0] if node.attribute else None
    if attr is None:
        return None
    value = onnx.helper.get_attribute_value(attr)
    if attr.name == "value":
        return numpy_helper.to_array(value)
    if attr.name in ("value_float", "value_int"):
        return np.array(value, dtype=np.float32 if attr.name == "value_float" else np.int64)
    if attr.name in ("value_floats", "value_ints"):
        return np.array(value, dtype=np.float32 if attr.name == "value_floats" else np.int64)
    return None


# Initializers larger than this reach shape inference as typed graph inputs without their
# data: no shape arithmetic reads them, and serializing a model's weights for onnx's C++
# shape inference was most of an import's time.
SHAPE_ONLY_ELEMENTS = 1024


def _inferred_types(model: onnx.ModelProto) -> dict:
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_weights(model), strict_mode=False,
                                                     data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        inferred = model
    types = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type
    return types


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for shape inference: initializers of more than
    SHAPE_ONLY_ELEMENTS elements become graph inputs of their type and shape (no data)."""
    big = [t for t in model.graph.initializer if int(np.prod(t.dims)) > SHAPE_ONLY_ELEMENTS]
    if not big:
        return model
    source = model.graph
    graph = onnx.GraphProto(name=source.name, doc_string=source.doc_string)
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(graph, field).extend(getattr(source, field))
    dropped = {t.name for t in big}
    graph.initializer.extend(t for t in source.initializer if t.name not in dropped)
    declared = {v.name for v in source.input}
    graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in big if t.name not in declared)
    stripped = onnx.ModelProto(ir_version=model.ir_version, graph=graph)
    stripped.opset_import.extend(model.opset_import)
    stripped.functions.extend(model.functions)
    return stripped


def with_fixed_inputs(model: onnx.ModelProto, shapes: dict[str, tuple]) -> onnx.ModelProto:
    """A copy whose graph inputs carry the fixed shapes (so that shape inference sees them)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        dims = shapes.get(value.name)
        if dims is None or not value.type.HasField("tensor_type"):
            continue
        shape = value.type.tensor_type.shape
        if len(shape.dim) != len(dims):
            continue
        for dim, want in zip(shape.dim, dims):
            if isinstance(want, int):
                dim.Clear()
                dim.dim_value = want
    return fixed
